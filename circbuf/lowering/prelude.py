"""The self-contained device library every kernel starts with.

NVRTC from PyPI ships no headers, so the 16-bit float types, conversions
(through PTX ``cvt``), math wrappers with torch's NaN behaviour, vector
copies and the block reduction live here. Kernels call these by name; the
kernel body itself is generated from the kernel IR.
"""

PRELUDE = r"""
// ---- circbuf prelude (self-contained: NVRTC from PyPI has no headers) ----
struct __align__(2) cb_bfloat16 { unsigned short raw; };
struct __align__(2) cb_half { unsigned short raw; };

template <typename T, int N> struct Tensor { T* data; index_t size[N]; index_t stride[N]; };
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };  // encoded on the host
template <typename T> struct Tensor<T, 0> { T* data; };

__device__ __forceinline__ index_t ceilDiv(index_t a, index_t b) { return (a + b - 1) / b; }

namespace cb {

__device__ __forceinline__ float bf16_to_float(cb_bfloat16 x) {
  return __uint_as_float(((unsigned)x.raw) << 16);
}
__device__ __forceinline__ cb_bfloat16 float_to_bf16(float f) {
  cb_bfloat16 r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.raw) : "f"(f)); return r;
}
__device__ __forceinline__ float half_to_float(cb_half x) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.raw)); return f;
}
__device__ __forceinline__ cb_half float_to_half(float f) {
  cb_half r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.raw) : "f"(f)); return r;
}

template <typename To, typename From> struct Caster {
  static __device__ __forceinline__ To run(From x) { return static_cast<To>(x); }
};
template <typename From> struct Caster<cb_bfloat16, From> {
  static __device__ __forceinline__ cb_bfloat16 run(From x) { return float_to_bf16(static_cast<float>(x)); }
};
template <typename To> struct Caster<To, cb_bfloat16> {
  static __device__ __forceinline__ To run(cb_bfloat16 x) { return static_cast<To>(bf16_to_float(x)); }
};
template <typename From> struct Caster<cb_half, From> {
  static __device__ __forceinline__ cb_half run(From x) { return float_to_half(static_cast<float>(x)); }
};
template <typename To> struct Caster<To, cb_half> {
  static __device__ __forceinline__ To run(cb_half x) { return static_cast<To>(half_to_float(x)); }
};
template <> struct Caster<cb_bfloat16, cb_bfloat16> {
  static __device__ __forceinline__ cb_bfloat16 run(cb_bfloat16 x) { return x; }
};
template <> struct Caster<cb_half, cb_half> {
  static __device__ __forceinline__ cb_half run(cb_half x) { return x; }
};
template <> struct Caster<cb_bfloat16, cb_half> {
  static __device__ __forceinline__ cb_bfloat16 run(cb_half x) { return float_to_bf16(half_to_float(x)); }
};
template <> struct Caster<cb_half, cb_bfloat16> {
  static __device__ __forceinline__ cb_half run(cb_bfloat16 x) { return float_to_half(bf16_to_float(x)); }
};
template <typename To, typename From> __device__ __forceinline__ To cast(From x) {
  return Caster<To, From>::run(x);
}

__device__ __forceinline__ float exp(float x) { return ::expf(x); }
__device__ __forceinline__ double exp(double x) { return ::exp(x); }
__device__ __forceinline__ float exp2(float x) { return ::exp2f(x); }
__device__ __forceinline__ double exp2(double x) { return ::exp2(x); }
__device__ __forceinline__ float log(float x) { return ::logf(x); }
__device__ __forceinline__ double log(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt(float x) { return ::sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
__device__ __forceinline__ float rsqrt(float x) { return ::rsqrtf(x); }
__device__ __forceinline__ double rsqrt(double x) { return ::rsqrt(x); }
__device__ __forceinline__ float tanh(float x) { return ::tanhf(x); }
__device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float abs(float x) { return ::fabsf(x); }
__device__ __forceinline__ double abs(double x) { return ::fabs(x); }
__device__ __forceinline__ int abs(int x) { return x < 0 ? -x : x; }
__device__ __forceinline__ long long abs(long long x) { return x < 0 ? -x : x; }
template <typename T> __device__ __forceinline__ T neg(T x) { return -x; }
__device__ __forceinline__ float reciprocal(float x) { return 1.0f / x; }
__device__ __forceinline__ double reciprocal(double x) { return 1.0 / x; }
template <typename T> __device__ __forceinline__ T relu(T x) { return x <= T(0) ? T(0) : x; }
template <typename T> __device__ __forceinline__ T sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }
template <typename T> __device__ __forceinline__ T silu(T x) { return x / (T(1) + exp(-x)); }
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + ::erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ double gelu(double x) { return 0.5 * x * (1.0 + ::erf(x * 0.70710678118654752)); }

// ---- fast fp32 variants: the fast_math lowering pass picks them for a value whose every
// path to an output ends in a rounding to bf16/fp16 that hides their error (at most 1/8 of
// an output ulp; circbuf/lowering/fast_math.py). Error bounds, PTX ISA 9.1, section 9.7.3:
//   ex2.approx.f32   at most 2 ulp from the correctly rounded 2^t over the full range;
//                    subnormal results kept (flushed only with .ftz)
//   rcp.approx.f32   at most 1 ulp
//   tanh.approx.f32  relative error at most 2^-11 over the full range (sm_75 on)
__device__ __forceinline__ float ex2_approx(float t) {
  float r;
  asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(t));
  return r;
}
__device__ __forceinline__ float ex2_approx_ftz(float t) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
  return r;
}
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// e^x = 2^(x log2 e): 2 ulp, plus the rounding of t = x log2 e, |t| 2^-24 ln 2 relative
// (below 2^-17.4 wherever e^x is finite): relative error < 2^-17. FMUL, MUFU.EX2 and 3
// instructions that keep subnormal results, against 8 for expf.
__device__ __forceinline__ float fast_exp(float x) { return ex2_approx(x * 1.44269504088896341f); }
// sigmoid(x) = s for x >= 0, e s below, e = e^-|x| in (0, 1], s = 1 / (1 + e): the reciprocal's
// argument lies in [1, 2] (never overflows, never subnormal), and e s keeps its relative
// accuracy down to e^-103 (torch's 1 / (1 + e^-x) is 0 below x = -88.7). Relative error
// < 2^-16 (exp's, 1 ulp rcp, two roundings); -0.0 gives 0.5, NaN gives NaN.
__device__ __forceinline__ float fast_sigmoid(float x) {
  const float e = fast_exp(-::fabsf(x));
  const float s = rcp_approx_ftz(1.0f + e);
  return x >= 0.0f ? s : e * s;
}
// silu(x) = x sigmoid(x): no IEEE division (its slow path and branch); silu(-inf) is NaN
// (-inf * 0), as torch's -inf / inf
__device__ __forceinline__ float fast_silu(float x) { return x * fast_sigmoid(x); }
// tanh.approx.f32: one MUFU.TANH, relative error 2^-11 (1/8 of a bf16 ulp; the pass never
// uses it for fp16 results, nor where a sum or difference follows)
__device__ __forceinline__ float fast_tanh(float x) {
#if __CUDA_ARCH__ >= 750
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return ::tanhf(x);
#endif
}
// gelu(x) = x Phi(x); Phi(x) = 1 - h for x >= 0, h below, h = erfc(|x| / sqrt 2) / 2.
// erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a / 2) (the form of Numerical Recipes' erfcc);
// P is our degree-5 fit (scripts/fit_fast_gelu.py): |error| < 2^-17 in the exponent over
// a in [0, 9.5], i.e. relative error of erfc. In base 2 with the 1/2 folded in:
// h = t 2^(Q(t) - x^2 log2(e) / 2), Q = log2(e) P - 1. h goes subnormal below x = -13.2:
// flushed (.ftz) there, gelu is -0, as torch's 1 + erf(x / sqrt 2), which is 0 below -5.5.
// erfc is computed directly, not as 1 + erf: the negative tail keeps its relative accuracy.
// Relative error < 2^-15.5 (the fit, x^2 rounded at |x| ~ 12, ex2, rcp); MUFU.RCP and
// MUFU.EX2 and ~14 more instructions, against ~27 for erff's gelu. gelu(-inf) = NaN, as torch.
__device__ __forceinline__ float fast_gelu(float x) {
  const float t = rcp_approx_ftz(::fabsf(x) * 0.353553390593273762f + 1.0f);
  float q = 0.3300761282444f;
  q = q * t - 1.023150086402893f;
  q = q * t + 0.6845528483390808f;
  q = q * t + 0.36708226799964905f;
  q = q * t + 1.4686833620071411f;
  q = q * t - 2.8272335529327393f;
  const float h = t * ex2_approx_ftz(q - (x * 0.721347520444482f) * x);
  return x * (x >= 0.0f ? 1.0f - h : h);
}
// NaN-propagating, as torch.maximum / torch.max
template <typename T> __device__ __forceinline__ T maximum(T a, T b) {
  return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
}
template <typename T> __device__ __forceinline__ T minimum(T a, T b) {
  return (a != a) ? a : ((b != b) ? b : (a < b ? a : b));
}
// fp32: one FMNMX.NAN (PTX max.NaN / min.NaN, sm_80 on: a NaN operand gives NaN) instead of four instructions
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ float maximum(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float minimum(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#endif


// ---- the rest of fd.ops: CUDA's math library in float and double (16-bit floats
// arrive as fp32), integer overloads where torch defines the op on integers ----
#define CB_FLOAT_FN(name, f32, f64)                                   \
  __device__ __forceinline__ float name(float x) { return ::f32(x); } \
  __device__ __forceinline__ double name(double x) { return ::f64(x); }
CB_FLOAT_FN(sin, sinf, sin)
CB_FLOAT_FN(cos, cosf, cos)
CB_FLOAT_FN(tan, tanf, tan)
CB_FLOAT_FN(asin, asinf, asin)
CB_FLOAT_FN(acos, acosf, acos)
CB_FLOAT_FN(atan, atanf, atan)
CB_FLOAT_FN(sinh, sinhf, sinh)
CB_FLOAT_FN(cosh, coshf, cosh)
CB_FLOAT_FN(asinh, asinhf, asinh)
CB_FLOAT_FN(acosh, acoshf, acosh)
CB_FLOAT_FN(atanh, atanhf, atanh)
CB_FLOAT_FN(erf, erff, erf)
CB_FLOAT_FN(erfc, erfcf, erfc)
CB_FLOAT_FN(erfinv, erfinvf, erfinv)
CB_FLOAT_FN(erfcinv, erfcinvf, erfcinv)
CB_FLOAT_FN(lgamma, lgammaf, lgamma)
CB_FLOAT_FN(log1p, log1pf, log1p)
CB_FLOAT_FN(expm1, expm1f, expm1)
CB_FLOAT_FN(log2, log2f, log2)
CB_FLOAT_FN(log10, log10f, log10)
CB_FLOAT_FN(floor, floorf, floor)
CB_FLOAT_FN(ceil, ceilf, ceil)
CB_FLOAT_FN(round, rintf, rint)  // halves to even (the default rounding mode), as torch.round
CB_FLOAT_FN(trunc, truncf, trunc)
#undef CB_FLOAT_FN
// integers are whole already
#define CB_INT_IDENTITY(name)                                  \
  __device__ __forceinline__ int name(int x) { return x; } \
  __device__ __forceinline__ long long name(long long x) { return x; }
CB_INT_IDENTITY(floor)
CB_INT_IDENTITY(ceil)
CB_INT_IDENTITY(round)
CB_INT_IDENTITY(trunc)
#undef CB_INT_IDENTITY
__device__ __forceinline__ float frac(float x) { return x - ::truncf(x); }
__device__ __forceinline__ double frac(double x) { return x - ::trunc(x); }

// predicates: integers and Bool are never NaN or infinite
template <typename T> __device__ __forceinline__ bool isnan(T x) { return x != x; }
template <typename T> __device__ __forceinline__ bool isinf(T) { return false; }
__device__ __forceinline__ bool isinf(float x) { return ::isinf(x); }
__device__ __forceinline__ bool isinf(double x) { return ::isinf(x); }
template <typename T> __device__ __forceinline__ bool isfinite(T) { return true; }
__device__ __forceinline__ bool isfinite(float x) { return ::isfinite(x); }
__device__ __forceinline__ bool isfinite(double x) { return ::isfinite(x); }
template <typename T> __device__ __forceinline__ bool isposinf(T x) { return x > T(0) && isinf(x); }
template <typename T> __device__ __forceinline__ bool isneginf(T x) { return x < T(0) && isinf(x); }
template <typename T> __device__ __forceinline__ bool isreal(T) { return true; }  // no complex types
template <typename T> __device__ __forceinline__ bool signbit(T x) { return x < T(0); }
__device__ __forceinline__ bool signbit(bool) { return false; }
__device__ __forceinline__ bool signbit(float x) { return ::signbit(x); }  // -0.0 and -NaN too
__device__ __forceinline__ bool signbit(double x) { return ::signbit(x); }

__device__ __forceinline__ bool bitwise_not(bool x) { return !x; }
__device__ __forceinline__ int bitwise_not(int x) { return ~x; }
__device__ __forceinline__ long long bitwise_not(long long x) { return ~x; }

__device__ __forceinline__ float pow(float a, float b) { return ::powf(a, b); }
__device__ __forceinline__ double pow(double a, double b) { return ::pow(a, b); }
// integer powers by squaring (wrapping, in unsigned arithmetic); a negative
// exponent gives 0 unless the base is +-1, as torch and nvFuser
template <typename T, typename U> __device__ __forceinline__ T ipow(T a, T b) {
  if (b < 0) return a == 1 ? T(1) : a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0);
  U r = 1, x = static_cast<U>(a);
  for (; b; b >>= 1) {
    if (b & 1) r *= x;
    x *= x;
  }
  return static_cast<T>(r);
}
__device__ __forceinline__ int pow(int a, int b) { return ipow<int, unsigned>(a, b); }
__device__ __forceinline__ long long pow(long long a, long long b) { return ipow<long long, unsigned long long>(a, b); }

// fmod: the sign of a (C); remainder: the sign of b (Python, torch.remainder); mod: C's %
__device__ __forceinline__ float fmod(float a, float b) { return ::fmodf(a, b); }
__device__ __forceinline__ double fmod(double a, double b) { return ::fmod(a, b); }
__device__ __forceinline__ int fmod(int a, int b) { return a % b; }
__device__ __forceinline__ long long fmod(long long a, long long b) { return a % b; }
template <typename T> __device__ __forceinline__ T remainder(T a, T b) {
  T m = fmod(a, b);
  return (m != T(0) && ((b < T(0)) != (m < T(0)))) ? m + b : m;
}
template <typename T> __device__ __forceinline__ T mod(T a, T b) { return fmod(a, b); }
__device__ __forceinline__ float atan2(float a, float b) { return ::atan2f(a, b); }
__device__ __forceinline__ double atan2(double a, double b) { return ::atan2(a, b); }
__device__ __forceinline__ float nextafter(float a, float b) { return ::nextafterf(a, b); }
__device__ __forceinline__ double nextafter(double a, double b) { return ::nextafter(a, b); }
template <typename T> __device__ __forceinline__ T gcd(T a, T b) {
  a = a < 0 ? -a : a;
  b = b < 0 ? -b : b;
  while (b != 0) {
    T t = a % b;
    a = b;
    b = t;
  }
  return a;
}
// shifts as torch defines them for any amount: out of [0, bits) a left shift
// gives 0 and an arithmetic right shift the sign; a logical one (zeros shifted
// in) gives 0
__device__ __forceinline__ int bitwise_left_shift(int a, int b) {
  return (b < 0 || b >= 32) ? 0 : static_cast<int>(static_cast<unsigned>(a) << b);
}
__device__ __forceinline__ long long bitwise_left_shift(long long a, long long b) {
  return (b < 0 || b >= 64) ? 0 : static_cast<long long>(static_cast<unsigned long long>(a) << b);
}
__device__ __forceinline__ int bitwise_right_shift(int a, int b) { return a >> ((b < 0 || b >= 32) ? 31 : b); }
__device__ __forceinline__ long long bitwise_right_shift(long long a, long long b) {
  return a >> ((b < 0 || b >= 64) ? 63 : b);
}
__device__ __forceinline__ int logical_right_shift(int a, int b) {
  return (b < 0 || b >= 32) ? 0 : static_cast<int>(static_cast<unsigned>(a) >> b);
}
__device__ __forceinline__ long long logical_right_shift(long long a, long long b) {
  return (b < 0 || b >= 64) ? 0 : static_cast<long long>(static_cast<unsigned long long>(a) >> b);
}

struct AddOp { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct MulOp { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct MaxOp { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return maximum(a, b); } };
struct MinOp { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return minimum(a, b); } };

template <typename T, int N> struct alignas(sizeof(T) * N) Array { T v[N]; };

// dst[0..N) = src[0..N) as one access of N * sizeof(T) bytes
template <int N, typename T> __device__ __forceinline__ void vec_copy(T* dst, const T* src) {
  *reinterpret_cast<Array<T, N>*>(dst) = *reinterpret_cast<const Array<T, N>*>(src);
}

// A row store's pair: staging-row columns col, col + 1 (src, 4-byte aligned in shared
// memory; col even, of a row of `width` columns) to dst = the output's element at col;
// `left` >= 1 elements of the output row are in range from dst where `guard` (the
// pair's bounds) holds; nothing is stored where it does not. Where dst is 4-byte
// aligned the pair is one 4-byte store (2-byte where only dst is in range). Elsewhere (an
// odd-width row) the row's 4-byte pieces start one element earlier: (col - 1, col) at
// dst - 1, but the staging row's first element alone, and its last (col + 1) alone, as
// the output row's last element (col + 1 when left == 2: the next pair is out of range).
// The staging tile is swizzled in SW-byte rows (0: not swizzled; the buffer 1024-byte
// aligned): address bits [4, 4 + log2(SW / 16)) are XORed with bits [7, ..), so the
// element before src lies at swz(swz(src) - 2 bytes).
template <int SW> __device__ __forceinline__ unsigned swizzle_addr(unsigned a) {
  return SW ? a ^ ((a >> 3) & (unsigned)((SW / 16 - 1) << 4)) : a;
}
// A 4- or 2-byte global store where p holds, as one predicated instruction (no branch)
__device__ __forceinline__ void st_global_if(bool p, unsigned* a, unsigned v) {
  asm volatile("{ .reg .pred q; setp.ne.b32 q, %0, 0; @q st.global.b32 [%1], %2; }" :: "r"((int)p), "l"(a), "r"(v));
}
__device__ __forceinline__ void st_global_if(bool p, unsigned short* a, unsigned v) {
  asm volatile("{ .reg .pred q; setp.ne.b32 q, %0, 0; @q st.global.b16 [%1], %2; }"
               :: "r"((int)p), "l"(a), "h"((unsigned short)v));
}
template <int SW, typename T>
__device__ __forceinline__ void row_store2(T* dst, const T* src, index_t col, index_t width, index_t left,
                                           bool guard) {
  static_assert(sizeof(T) == 2, "a row store moves 16-bit elements");
  // No branches: the shared loads run whatever `guard` (the pair's bounds) says, the stores
  // are predicated on it, so that the unrolled row loop issues several iterations' loads
  // before their stores (with branches each iteration waited out its loads in turn; the
  // compiler sinks loads into branches a plain `if` leaves, hence the predicated PTX stores)
  const unsigned v = *reinterpret_cast<const unsigned*>(src);
  unsigned short* d = reinterpret_cast<unsigned short*>(dst);
  const bool al = (reinterpret_cast<unsigned long long>(d) & 3) == 0;
  const unsigned s = (unsigned)__cvta_generic_to_shared(src);
  const int back = (al || col == 0) ? 0 : (int)swizzle_addr<SW>(swizzle_addr<SW>(s) - 2) - (int)s;  // bytes from src
  const unsigned prev = *reinterpret_cast<const unsigned short*>(reinterpret_cast<const char*>(src) + back);
  st_global_if(guard && (al ? left >= 2 : col != 0), reinterpret_cast<unsigned*>(al ? d : d - 1),
               al ? v : (prev | (v << 16)));
  st_global_if(guard && (al ? left < 2 : col == 0), d, v);
  st_global_if(guard && !al && (left == 2 || (col + 2 == width && left > 2)), d + 1, v >> 16);
}

// Reduce v over threadIdx.x (blockDim.x a multiple of 32), separately for each
// threadIdx.y row; every thread gets the result. smem holds 32 * blockDim.y values.
// A barrier over the first `threads` threads (named barrier `id`), or all of them.
__device__ __forceinline__ void sync_threads(int id, int threads) {
  if (id == 0) __syncthreads();
  else asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N));
}

// __shfl_xor_sync has no bool overload (a bool comes back as an int, which no Op takes)
template <typename T> __device__ __forceinline__ T shfl_xor(T v, int o) {
  return static_cast<T>(__shfl_xor_sync(0xffffffffu, v, o));
}

template <typename T, typename Op>
__device__ __forceinline__ T block_reduce_x(T v, Op op, T init, T* smem, int bar_id = 0, int bar_threads = 0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  if (nwarps == 1) return v;
  T* row = smem + threadIdx.y * 32;
  sync_threads(bar_id, bar_threads);  // an earlier reduction may still be reading smem
  if (lane == 0) row[warp] = v;
  sync_threads(bar_id, bar_threads);
  v = lane < nwarps ? row[lane] : init;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  return v;
}

// Reduce v over the first Y rows of threads (threadIdx.y), separately for each
// threadIdx.x; every thread of those rows gets the result, combined in row order.
// smem holds blockDim.x * Y values.
template <int Y, typename T, typename Op>
__device__ __forceinline__ T block_reduce_y(T v, Op op, T* smem, int bar_id = 0, int bar_threads = 0) {
  if (Y == 1) return v;
  sync_threads(bar_id, bar_threads);  // an earlier reduction may still be reading smem
  smem[threadIdx.y * blockDim.x + threadIdx.x] = v;
  sync_threads(bar_id, bar_threads);
  v = smem[threadIdx.x];
#pragma unroll
  for (int y = 1; y < Y; ++y) v = op(v, smem[y * blockDim.x + threadIdx.x]);
  return v;
}

// ---- mbarriers and bulk tensor copies (sm_90) ----
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mbar_inval(unsigned long long* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned long long* bar, unsigned parity) {
  unsigned ok;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return ok != 0;
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {}
}
// CIRCBUF_DEBUG_HANG: give up after `tries`, leave (1, barrier, stage, parity) in the
// host-mapped record and trap; the runtime turns that into a CircbufError.
// Inlined, not a call: with setmaxnreg, a call from the producer (after .dec 40) or from
// both roles makes ptxas fail (C7600 "register allocation failed", NVRTC 13.0 and 13.5).
__device__ __forceinline__ void mbar_wait_bounded(unsigned long long* bar, unsigned parity, long long tries,
                                                  int barrier, int stage, unsigned* record) {
  for (long long t = 0; !mbar_try_wait(bar, parity); ++t) {
    if (t >= tries) {
      if (atomicCAS(record, 0u, 1u) == 0u) {
        record[1] = barrier; record[2] = stage; record[3] = parity;
      }
      __threadfence_system();
      __trap();
    }
  }
}
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, unsigned long long* bar, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, unsigned long long* bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, unsigned long long* bar, int c0, int c1,
                                         int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, unsigned long long* bar, int c0, int c1,
                                         int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, unsigned long long* bar, int c0, int c1,
                                         int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar)) : "memory");
}

// ---- thread-block clusters (sm_90): multicast copies, remote arrivals, cluster barriers ----
// this CTA's rank in its cluster (%cluster_ctarank: for a 1-D cluster, the CTA's x index modulo the cluster size)
__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// every thread of every CTA of the cluster; release/acquire order the shared-memory and barrier
// operations before it (in any CTA of the cluster) with those after it
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// one arrival on the mbarrier at bar's offset in CTA `cta` of the cluster (mapa: its address there;
// release at CTA scope, as CUTLASS's ClusterBarrier::arrive: the releasing reads are done)
__device__ __forceinline__ void mbar_arrive_cluster(unsigned long long* bar, unsigned cta) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
// the box lands at dst's offset in every CTA of `mask` (bit i: rank i), each completing on
// the mbarrier at bar's offset there
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                                   unsigned short mask, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2}], [%3], %4;"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(smem_u32(bar)), "h"(mask) : "memory");
}
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                                   unsigned short mask, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(mask) : "memory");
}
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                                   unsigned short mask, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3, %4}], [%5], %6;"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar)), "h"(mask) : "memory");
}
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                                   unsigned short mask, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)), "h"(mask) : "memory");
}
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                                   unsigned short mask, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;"
               :: "r"(smem_u32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar)), "h"(mask) : "memory");
}

// ---- TMA stores and bulk groups (sm_90) ----
// the threads' shared-memory writes, visible to bulk copies issued after the next barrier
// ---- cp.async (sm_80+): a ring filled by the producer's threads ----
// B bytes from global src to shared dst; src_bytes < B zero-fills the rest (0: all zeros,
// src not read). 16-byte copies bypass L1 (.cg), smaller ones may not (.ca only).
template <int B> __device__ __forceinline__ void cp_async(void* dst, const void* src, unsigned src_bytes) {
  static_assert(B == 4 || B == 8 || B == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (B == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_u32(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" :: "r"(smem_u32(dst)), "l"(src), "n"(B),
                 "r"(src_bytes) : "memory");
  }
}
// one arrival on bar once this thread's earlier cp.asyncs have landed (.noinc: counted
// among the barrier's expected arrivals)
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Programmatic dependent launch (sm_90): the stream's next kernel may be scheduled
// from now on (its CTAs wait in their own call below until this grid is done), then
// wait until the previous kernel has finished and its writes are visible: the first
// statement of every kernel, so no memory is touched before. A kernel not launched
// with the attribute returns from the wait at once.
__device__ __forceinline__ void grid_dependency() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// true on one lane of a converged warp
__device__ __forceinline__ bool elect_one() {
  unsigned ok;
  asm volatile("{ .reg .pred p; elect.sync _|p, 0xffffffff; selp.u32 %0, 1, 0, p; }" : "=r"(ok));
  return ok != 0;
}
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];"
               :: "l"(map), "r"(smem_u32(src)), "r"(c0) : "memory");
}
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
               :: "l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
               :: "l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3,
                                          int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];"
               :: "l"(map), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// at most N of this thread's bulk groups still pending (_read: still reading shared memory)
template <int N> __device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" :: "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}

// ---- warpgroup MMA (sm_90a) ----
// a shared-memory matrix descriptor: start address, leading/stride byte
// offsets (16-byte units) and the swizzle mode (1: 128B, 2: 64B, 3: 32B)
__device__ __forceinline__ unsigned long long smem_desc(const void* p, unsigned lbo, unsigned sbo, unsigned swizzle) {
  unsigned long long a = smem_u32(p);
  return ((a & 0x3FFFFull) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) | ((unsigned long long)swizzle << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}

}  // namespace cb
// ---- end of prelude ----
"""
