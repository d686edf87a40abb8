// The scan passes of a route over one H x W state map, in the map's own memory layout.
//
// A route (code bits: 1 from_right, 2 from_bottom, 4 columns_first, 8 flat) is two passes over the
// map: one along the rows (serial along contiguous memory, left to right or right to left) and one
// down or up the columns (row by row, vectorised across the row). A 2D route runs them one after
// the other (rows first, or columns first); a flat route scans one sequence whose lines are the
// first pass's rows (columns) and whose line order is the second pass's direction, the state
// running on from the end of one line into the next. So a route never needs a reordered copy of
// the map: it is only the direction of each loop.
//
// A pass in place over values v with decays a, from the first cell of each line on:
//   forward (decay at the cell):      v[c] <- v[c] + a[c] * v[prev(c)]
//   adjoint (decay at the previous):  v[c] <- v[c] + a[prev(c)] * v[prev(c)]
// The adjoint of a forward pass is the adjoint form run in the opposite direction. Passes can read
// their input from another array than they write (out-of-place), scaled cell-wise by a factor
// (the adjoint's C * dy), and record the running products of the decays along each line (the
// flat routes' carries, see scan_lines).
//
// Like scan_2d_kernel.h, compiled once per instruction set inside namespace VMAMBA2D_ISA.
#ifndef VMAMBA2D_ISA
#error "define VMAMBA2D_ISA (the instruction-set namespace) before including scan_2d_passes.h"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace vmamba2d {
namespace cpu {
namespace VMAMBA2D_ISA {

// Number of rows whose serial recurrences along a row are advanced together.
constexpr int64_t kRowInterleave = 8;

// One pass over the map: along each row (else down / up each column), in reverse (right to left,
// bottom to top) or not.
struct Pass {
  bool along_rows;
  bool reverse;
};

inline Pass opposite(const Pass& pass) { return {pass.along_rows, !pass.reverse}; }

// A route as its two passes (see the file comment); flat routes chain the first pass's lines.
struct RoutePasses {
  Pass first;
  Pass second;
  bool flat;
};

inline RoutePasses route_passes(int64_t code) {
  const Pass rows{true, (code & 1) != 0};
  const Pass columns{false, (code & 2) != 0};
  const bool columns_first = (code & 4) != 0;
  return {columns_first ? columns : rows, columns_first ? rows : columns, (code & 8) != 0};
}

// The arrays of one pass: out[c] = in[c] (times scale[c] when scale is set) + the recurrence term;
// in may be out. products (when set) receives the running product of the decays along each line:
// forward a[first] ... a[c], adjoint a[first] ... a[prev(c)] (1 at the first cell).
template <typename T>
struct PassArrays {
  const T* decay;
  const T* in;
  const T* scale;
  T* out;
  T* products;
};

template <typename T, bool kAdjoint, bool kScaled, bool kProducts, int64_t kRows>
inline void scan_row_block(const PassArrays<T>& a, int64_t first_row, int64_t width, bool reverse) {
  T carry[kRows] = {};
  T product[kRows];
  for (int64_t r = 0; r < kRows; ++r) product[r] = T(1);
  for (int64_t step = 0; step < width; ++step) {
    const int64_t j = reverse ? width - 1 - step : step;
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t p = (first_row + r) * width + j;
      T x = a.in[p];
      if constexpr (kScaled) x = a.scale[p] * x;
      if constexpr (kAdjoint) {
        const T v = x + carry[r];  // carry = a[prev] * v[prev]
        a.out[p] = v;
        carry[r] = a.decay[p] * v;
        if constexpr (kProducts) {
          a.products[p] = product[r];
          product[r] = a.decay[p] * product[r];
        }
      } else {
        carry[r] = a.decay[p] * carry[r] + x;
        a.out[p] = carry[r];
        if constexpr (kProducts) {
          product[r] = a.decay[p] * product[r];
          a.products[p] = product[r];
        }
      }
    }
  }
}

#ifdef VMAMBA2D_ROW_SCAN_FLOATS
// The pass along rows with running products (forward or adjoint), for float, a vector of kLanes cells at a
// time: within a vector, the recurrence and the products are combined in log2(kLanes) shifted
// steps (each cell composes with the cell `shift` before it), then the vector continues from the
// carry and product of the previous vector's last cell. Only the vector stores of the values and
// products remain, where the serial form stores two scalars per cell (its bottleneck). The sums
// are reassociated, so results differ from the serial form by fp32 rounding.
namespace row_simd {

constexpr int kLanes = VMAMBA2D_ROW_SCAN_FLOATS;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(sizeof(float)), may_alias));

// The lanes moved kShift places along the scan (to higher lanes, or lower when kDown), the
// vacated lanes taken from fill.
template <int kShift, bool kDown, std::size_t... kLane>
inline Vec shifted(Vec x, Vec fill, std::index_sequence<kLane...>) {
  if constexpr (kDown) {
    return __builtin_shufflevector(
        x, fill, (static_cast<int>(kLane) + kShift < kLanes ? static_cast<int>(kLane) + kShift
                                                            : kLanes + static_cast<int>(kLane))...);
  } else {
    return __builtin_shufflevector(
        x, fill, (static_cast<int>(kLane) >= kShift ? static_cast<int>(kLane) - kShift
                                                    : kLanes + static_cast<int>(kLane))...);
  }
}

// In place: values -> their scan within the vector from a zero state, decays -> their running
// products within the vector.
template <bool kDown, int kShift = 1>
inline void scan_within(Vec& values, Vec& decays) {
  if constexpr (kShift < kLanes) {
    const auto lanes = std::make_index_sequence<kLanes>{};
    const Vec zero{};
    const Vec one = zero + 1.0f;
    values = decays * shifted<kShift, kDown>(values, zero, lanes) + values;
    decays = decays * shifted<kShift, kDown>(decays, one, lanes);
    scan_within<kDown, 2 * kShift>(values, decays);
  }
}

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(Vec));
  return v;
}

inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof(Vec)); }

// The adjoint form is the forward recurrence with each cell's decay taken from the previous cell
// (the row's first cell gets 1), so it runs the same vector scan on the shifted decays.
template <bool kAdjoint, bool kScaled, bool kReverse, int64_t kRows>
void scan_row_block(const PassArrays<float>& a, int64_t first_row, int64_t width) {
  const auto lanes = std::make_index_sequence<kLanes>{};
  float state[kRows] = {};     // the last cell's value
  float product[kRows];        // the last cell's product
  float last_decay[kRows];     // the last cell's decay (the adjoint's next shifted decay)
  for (int64_t r = 0; r < kRows; ++r) product[r] = last_decay[r] = 1.0f;
  const int64_t vectors = width / kLanes;
  constexpr int kLast = kReverse ? 0 : kLanes - 1;
  for (int64_t v = 0; v < vectors; ++v) {
    const int64_t j = kReverse ? width - (v + 1) * kLanes : v * kLanes;
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t p = (first_row + r) * width + j;
      Vec values = load(a.in + p);
      if constexpr (kScaled) values = values * load(a.scale + p);
      Vec decays = load(a.decay + p);
      if constexpr (kAdjoint) {
        const Vec raw = decays;
        decays = shifted<1, kReverse>(raw, Vec{} + last_decay[r], lanes);
        last_decay[r] = raw[kLast];
      }
      scan_within<kReverse>(values, decays);
      const Vec states = decays * state[r] + values;
      const Vec products = decays * product[r];
      store(a.out + p, states);
      store(a.products + p, products);
      state[r] = states[kLast];
      product[r] = products[kLast];
    }
  }
  // The serial form's carry: the state (adjoint: times the last decay) and the products so far.
  float carry[kRows];
  for (int64_t r = 0; r < kRows; ++r) {
    carry[r] = kAdjoint ? last_decay[r] * state[r] : state[r];
    if constexpr (kAdjoint) product[r] = last_decay[r] * product[r];
  }
  for (int64_t step = vectors * kLanes; step < width; ++step) {
    const int64_t j = kReverse ? width - 1 - step : step;
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t p = (first_row + r) * width + j;
      float x = a.in[p];
      if constexpr (kScaled) x = a.scale[p] * x;
      if constexpr (kAdjoint) {
        const float v = x + carry[r];
        a.out[p] = v;
        carry[r] = a.decay[p] * v;
        a.products[p] = product[r];
        product[r] = a.decay[p] * product[r];
      } else {
        carry[r] = a.decay[p] * carry[r] + x;
        a.out[p] = carry[r];
        product[r] = a.decay[p] * product[r];
        a.products[p] = product[r];
      }
    }
  }
}

// Two rows at a time (enough to overlap one row's carry latency with the other's work).
template <bool kAdjoint, bool kScaled, bool kReverse>
void scan_rows(const PassArrays<float>& a, int64_t height, int64_t width) {
  int64_t i = 0;
  for (; i + 2 <= height; i += 2) scan_row_block<kAdjoint, kScaled, kReverse, 2>(a, i, width);
  if (i < height) scan_row_block<kAdjoint, kScaled, kReverse, 1>(a, i, width);
}

}  // namespace row_simd
#endif

// The pass along every row, kRowInterleave rows at a time.
template <typename T, bool kAdjoint, bool kScaled, bool kProducts>
void scan_rows(const PassArrays<T>& a, int64_t height, int64_t width, bool reverse) {
#ifdef VMAMBA2D_ROW_SCAN_FLOATS
  if constexpr (std::is_same_v<T, float> && kProducts) {
    if (width >= row_simd::kLanes) {
      if (reverse) row_simd::scan_rows<kAdjoint, kScaled, true>(a, height, width);
      else row_simd::scan_rows<kAdjoint, kScaled, false>(a, height, width);
      return;
    }
  }
#endif
  int64_t i = 0;
  for (; i + kRowInterleave <= height; i += kRowInterleave) {
    scan_row_block<T, kAdjoint, kScaled, kProducts, kRowInterleave>(a, i, width, reverse);
  }
  for (; i < height; ++i) scan_row_block<T, kAdjoint, kScaled, kProducts, 1>(a, i, width, reverse);
}

// The pass down (up) every column, one row at a time across the whole row.
template <typename T, bool kAdjoint, bool kScaled, bool kProducts>
void scan_columns(const PassArrays<T>& a, int64_t height, int64_t width, bool reverse) {
  const int64_t first = reverse ? (height - 1) * width : 0;
  const int64_t step = reverse ? -width : width;
  for (int64_t j = 0; j < width; ++j) {
    const int64_t p = first + j;
    a.out[p] = kScaled ? a.scale[p] * a.in[p] : a.in[p];
    if constexpr (kProducts) a.products[p] = kAdjoint ? T(1) : a.decay[p];
  }
  for (int64_t t = 1; t < height; ++t) {
    const int64_t row = first + t * step;
    const int64_t prev = row - step;
    const T* decay = a.decay + (kAdjoint ? prev : row);
    for (int64_t j = 0; j < width; ++j) {
      const T x = kScaled ? a.scale[row + j] * a.in[row + j] : a.in[row + j];
      a.out[row + j] = x + decay[j] * a.out[prev + j];
    }
    if constexpr (kProducts) {
      for (int64_t j = 0; j < width; ++j) a.products[row + j] = decay[j] * a.products[prev + j];
    }
  }
}

template <typename T, bool kAdjoint, bool kScaled, bool kProducts>
void scan_pass_as(const Pass& pass, const PassArrays<T>& a, int64_t height, int64_t width) {
  if (pass.along_rows) {
    scan_rows<T, kAdjoint, kScaled, kProducts>(a, height, width, pass.reverse);
  } else {
    scan_columns<T, kAdjoint, kScaled, kProducts>(a, height, width, pass.reverse);
  }
}

// One pass (forward, or adjoint when kAdjoint) over the map.
template <typename T, bool kAdjoint>
void scan_pass(const Pass& pass, const PassArrays<T>& a, int64_t height, int64_t width) {
  const bool scaled = a.scale != nullptr;
  if (a.products != nullptr) {
    if (scaled) scan_pass_as<T, kAdjoint, true, true>(pass, a, height, width);
    else scan_pass_as<T, kAdjoint, false, true>(pass, a, height, width);
  } else {
    if (scaled) scan_pass_as<T, kAdjoint, true, false>(pass, a, height, width);
    else scan_pass_as<T, kAdjoint, false, false>(pass, a, height, width);
  }
}

// The lines of a flat scan (the rows, or the columns, of the map) in the order the scan visits
// them, and where each line starts and ends.
class LineOrder {
 public:
  LineOrder(const Pass& along, const Pass& across, int64_t height, int64_t width)
      : along_(along), across_(across), height_(height), width_(width) {}

  int64_t count() const { return along_.along_rows ? height_ : width_; }
  // The index (row or column) of the t-th line visited.
  int64_t line(int64_t t) const { return across_.reverse ? count() - 1 - t : t; }
  int64_t first_cell(int64_t t) const { return cell(line(t), along_.reverse ? line_length() - 1 : 0); }
  int64_t last_cell(int64_t t) const { return cell(line(t), along_.reverse ? 0 : line_length() - 1); }

 private:
  int64_t line_length() const { return along_.along_rows ? width_ : height_; }
  int64_t cell(int64_t line, int64_t position) const {
    return along_.along_rows ? line * width_ + position : position * width_ + line;
  }

  Pass along_;
  Pass across_;
  int64_t height_;
  int64_t width_;
};

// A flat scan: each line is scanned on its own (pass `along`, keeping the running decay products
// P), then the state entering the t-th line, carry[t], follows from the previous line's last cell,
// and every cell adds P * carry[t] (vectorised across rows). carries: one value per line.
template <typename T, bool kAdjoint>
void scan_lines(const Pass& along, const Pass& across, const PassArrays<T>& a, T* carries, int64_t height,
                int64_t width) {
  scan_pass<T, kAdjoint>(along, a, height, width);
  const LineOrder lines(along, across, height, width);
  const int64_t count = lines.count();
  if (count == 1) return;
  carries[lines.line(0)] = T(0);
  for (int64_t t = 1; t < count; ++t) {
    const int64_t end = lines.last_cell(t - 1);
    const T last = a.out[end] + a.products[end] * carries[lines.line(t - 1)];
    carries[lines.line(t)] = kAdjoint ? a.decay[end] * last : last;  // the state entering line t
  }
  if (along.along_rows) {
    for (int64_t t = 1; t < count; ++t) {
      const int64_t row = lines.line(t) * width;
      const T carry = carries[lines.line(t)];
      for (int64_t j = 0; j < width; ++j) a.out[row + j] += a.products[row + j] * carry;
    }
  } else {
    // Every column but the first one visited (whose carry is zero).
    const int64_t begin = across.reverse ? 0 : 1;
    const int64_t end = across.reverse ? width - 1 : width;
    for (int64_t i = 0; i < height; ++i) {
      const int64_t row = i * width;
      for (int64_t j = begin; j < end; ++j) a.out[row + j] += a.products[row + j] * carries[j];
    }
  }
}

// out[c] = weights[c] * source[prev(c)] along `pass`, or out[c] += that when accumulate; cells at
// the start of their line (no previous cell) get 0, or are left as they are when accumulate.
template <typename T>
void product_with_previous(const Pass& pass, const T* weights, const T* source, T* out, bool accumulate,
                           int64_t height, int64_t width) {
  const int64_t length = height * width;
  auto apply = [&](int64_t begin, int64_t end, int64_t shift) {
    if (accumulate) {
      for (int64_t p = begin; p < end; ++p) out[p] += weights[p] * source[p - shift];
    } else {
      for (int64_t p = begin; p < end; ++p) out[p] = weights[p] * source[p - shift];
    }
  };
  if (pass.along_rows) {
    const int64_t shift = pass.reverse ? -1 : 1;
    const int64_t start = pass.reverse ? width - 1 : 0;
    for (int64_t row = 0; row < length; row += width) {
      if (!accumulate) out[row + start] = T(0);
      apply(pass.reverse ? row : row + 1, pass.reverse ? row + width - 1 : row + width, shift);
    }
  } else {
    const int64_t start = pass.reverse ? length - width : 0;
    if (!accumulate) {
      for (int64_t j = 0; j < width; ++j) out[start + j] = T(0);
    }
    if (pass.reverse) {
      apply(0, length - width, -width);
    } else {
      apply(width, length, width);
    }
  }
}

}  // namespace VMAMBA2D_ISA
}  // namespace cpu
}  // namespace vmamba2d
