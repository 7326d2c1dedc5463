// Eight fp32 lanes as a GCC/Clang vector (one AVX register; plain code on other ISAs), shared by
// the compiled CPU kernels.
#pragma once

typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) { v8 r; __builtin_memcpy(&r, p, sizeof r); return r; }

// Sum of the 8 lanes, in one fixed pairwise order.
inline float hsum(v8 a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }
