// <math.h> for NVRTC: the float math functions (exp2f, fabsf, fmaf, ...) are device built-ins there.
#pragma once
