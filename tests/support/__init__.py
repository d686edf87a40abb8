"""Helpers the tests share (inputs, references, emulation builds, script loading); not tests."""
