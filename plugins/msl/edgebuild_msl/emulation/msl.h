// A CPU emulation of the subset of the Metal Shading Language edgebuild accepts (docs/msl.md).
//
// A kernel is compiled as C++20 against this header and run with one OS thread per lane of a
// threadgroup, so threadgroup memory, barriers and SIMD-group functions behave as on a GPU
// (and ThreadSanitizer sees a missing barrier as a race). Threadgroups run one after another.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstddef>
#include <cfloat>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <thread>
#include <type_traits>
#include <vector>

// -- scalar types -------------------------------------------------------------------------
using half = _Float16;  // IEEE binary16, as MSL's half; arithmetic rounds to half
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;

namespace eb {
template <class T> inline constexpr bool is_float_v = std::is_floating_point_v<T> || std::is_same_v<T, _Float16>;
template <class T> inline constexpr bool is_scalar_v = std::is_arithmetic_v<T> || std::is_same_v<T, _Float16>;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "msl emulation: %s\n", what);
  std::fflush(stderr);
  std::_Exit(86);  // the runner turns this code into a BuildError carrying the message
}
}  // namespace eb

// -- vector types ---------------------------------------------------------------------------
template <class T, int N> struct vec;

// A swizzle (v.xy, v.bgr) is a member sharing the vector's storage; it reads as a vec<T, M>
// and, when assigned, writes the components it names.
template <class T, int N, int... I> struct swizzle {
  static constexpr int M = sizeof...(I);
  T d[N];
  operator vec<T, M>() const { return vec<T, M>(d[I]...); }
  swizzle& operator=(const vec<T, M>& o) {
    T tmp[M];
    for (int k = 0; k < M; ++k) tmp[k] = o.v[k];
    int k = 0;
    ((d[I] = tmp[k++]), ...);
    return *this;
  }
  swizzle& operator=(const swizzle& o) { return *this = vec<T, M>(o); }
  vec<T, M> operator-() const { return -vec<T, M>(*this); }
  template <class B> swizzle& operator+=(const B& b) { return *this = vec<T, M>(*this) + b; }
  template <class B> swizzle& operator-=(const B& b) { return *this = vec<T, M>(*this) - b; }
  template <class B> swizzle& operator*=(const B& b) { return *this = vec<T, M>(*this) * b; }
  template <class B> swizzle& operator/=(const B& b) { return *this = vec<T, M>(*this) / b; }
};

template <class T, int N> struct vec_storage;
#include "msl_swizzles.h"

namespace eb {
template <class X> struct traits { static constexpr int n = 1; using elem = X; static constexpr bool vector = false; };
template <class T, int N> struct traits<vec<T, N>> { static constexpr int n = N; using elem = T; static constexpr bool vector = true; };
template <class T, int N, int... I> struct traits<swizzle<T, N, I...>> {
  static constexpr int n = sizeof...(I); using elem = T; static constexpr bool vector = true;
};
template <class X> inline constexpr bool is_vector_v = traits<std::decay_t<X>>::vector;
template <class X> inline constexpr int width_v = traits<std::decay_t<X>>::n;
template <class X> using elem_t = typename traits<std::decay_t<X>>::elem;

template <class T, class X> void flatten_into(T* out, int& k, const X& x) {
  if constexpr (is_vector_v<X>) {
    vec<elem_t<X>, width_v<X>> v(x);
    for (int i = 0; i < width_v<X>; ++i) out[k++] = T(v.v[i]);
  } else {
    out[k++] = T(x);
  }
}
}  // namespace eb

template <class T, int N>
struct alignas(sizeof(T) * (N == 3 ? 4 : N)) vec : vec_storage<T, N> {
  vec() = default;
  vec(const vec& o) = default;
  vec(T s) { for (int i = 0; i < N; ++i) this->v[i] = s; }  // MSL broadcasts a scalar
  template <class... A, class = std::enable_if_t<(sizeof...(A) >= 2) && ((eb::width_v<A> + ...) == N)>>
  vec(const A&... parts) {
    int k = 0;
    (eb::flatten_into(this->v, k, parts), ...);
  }
  template <class U, class = std::enable_if_t<!std::is_same_v<U, T>>>
  explicit vec(const vec<U, N>& o) { for (int i = 0; i < N; ++i) this->v[i] = T(o.v[i]); }
  vec& operator=(const vec& o) { std::memcpy(this->v, o.v, sizeof(T) * N); return *this; }
  T& operator[](int i) { return this->v[i]; }
  const T& operator[](int i) const { return this->v[i]; }
  template <class B> vec& operator+=(const B& b) { return *this = *this + b; }
  template <class B> vec& operator-=(const B& b) { return *this = *this - b; }
  template <class B> vec& operator*=(const B& b) { return *this = *this * b; }
  template <class B> vec& operator/=(const B& b) { return *this = *this / b; }
};

#define EB_VECTOR_TYPES(T, name) using name##2 = vec<T, 2>; using name##3 = vec<T, 3>; using name##4 = vec<T, 4>;
EB_VECTOR_TYPES(float, float)
EB_VECTOR_TYPES(half, half)
EB_VECTOR_TYPES(int, int)
EB_VECTOR_TYPES(uint, uint)
EB_VECTOR_TYPES(short, short)
EB_VECTOR_TYPES(ushort, ushort)
EB_VECTOR_TYPES(char, char)
EB_VECTOR_TYPES(uchar, uchar)
EB_VECTOR_TYPES(bool, bool)
#undef EB_VECTOR_TYPES

namespace eb {
// The vector a vector-like operand stands for; scalars stay scalars.
template <class X> auto as_vec(const X& x) {
  if constexpr (is_vector_v<X>) return vec<elem_t<X>, width_v<X>>(x);
  else return x;
}
template <class A, class B> constexpr int result_width() { return is_vector_v<A> ? width_v<A> : width_v<B>; }
template <class A, class B> using result_elem = std::conditional_t<is_vector_v<A>, elem_t<A>, elem_t<B>>;

template <class X> auto component(const X& x, int i) {
  if constexpr (is_vector_v<X>) return as_vec(x).v[i];
  else return x;
}

// Applies f component-wise; scalar operands are broadcast, the result has the vector's type R.
template <class R, class F, class... X> auto zip(F f, const X&... xs) {
  constexpr int n = std::max({width_v<X>...});
  vec<R, n> out;
  for (int i = 0; i < n; ++i) out.v[i] = R(f(component(xs, i)...));
  return out;
}
template <class A, class B> inline constexpr bool any_vector_v = is_vector_v<A> || is_vector_v<B>;
}  // namespace eb

#define EB_BINARY_OP(op)                                                                     \
  template <class A, class B, class = std::enable_if_t<eb::any_vector_v<A, B>>>              \
  auto operator op(const A& a, const B& b) {                                                 \
    using R = eb::result_elem<A, B>;                                                         \
    return eb::zip<R>([](auto x, auto y) { return x op y; }, a, b);                          \
  }
EB_BINARY_OP(+) EB_BINARY_OP(-) EB_BINARY_OP(*) EB_BINARY_OP(/) EB_BINARY_OP(%)
EB_BINARY_OP(&) EB_BINARY_OP(|) EB_BINARY_OP(^) EB_BINARY_OP(<<) EB_BINARY_OP(>>)
#undef EB_BINARY_OP
#define EB_COMPARE_OP(op)                                                                    \
  template <class A, class B, class = std::enable_if_t<eb::any_vector_v<A, B>>>              \
  auto operator op(const A& a, const B& b) {                                                 \
    return eb::zip<bool>([](auto x, auto y) { return x op y; }, a, b);                       \
  }
EB_COMPARE_OP(==) EB_COMPARE_OP(!=) EB_COMPARE_OP(<) EB_COMPARE_OP(<=) EB_COMPARE_OP(>) EB_COMPARE_OP(>=)
EB_COMPARE_OP(&&) EB_COMPARE_OP(||)
#undef EB_COMPARE_OP
template <class T, int N> vec<T, N> operator-(const vec<T, N>& a) { return eb::zip<T>([](T x) { return T(-x); }, a); }
template <class T, int N> vec<T, N> operator+(const vec<T, N>& a) { return a; }
template <class T, int N> vec<T, N> operator~(const vec<T, N>& a) { return eb::zip<T>([](T x) { return T(~x); }, a); }
template <class T, int N> vec<bool, N> operator!(const vec<T, N>& a) { return eb::zip<bool>([](T x) { return !x; }, a); }

// -- the metal namespace: functions -------------------------------------------------------
namespace metal {
// A function of floats, for float and half scalars and vectors (half computes in float and
// rounds once, as the GPU's fast path does within its ulp budget).
#define EB_FLOAT_FN1(name, expr)                                                             \
  template <class X, class = std::enable_if_t<eb::is_float_v<eb::elem_t<X>>>>                \
  auto name(const X& arg) {                                                                  \
    using T = eb::elem_t<X>;                                                                 \
    auto f = [](T t) { float x = float(t); return T(expr); };                                \
    if constexpr (eb::is_vector_v<X>) return eb::zip<T>(f, arg);                             \
    else return f(arg);                                                                      \
  }
EB_FLOAT_FN1(exp, std::exp(x)) EB_FLOAT_FN1(exp2, std::exp2(x)) EB_FLOAT_FN1(exp10, std::pow(10.0f, x))
EB_FLOAT_FN1(log, std::log(x)) EB_FLOAT_FN1(log2, std::log2(x)) EB_FLOAT_FN1(log10, std::log10(x))
EB_FLOAT_FN1(sqrt, std::sqrt(x)) EB_FLOAT_FN1(rsqrt, 1.0f / std::sqrt(x)) EB_FLOAT_FN1(fabs, std::fabs(x))
EB_FLOAT_FN1(sin, std::sin(x)) EB_FLOAT_FN1(cos, std::cos(x)) EB_FLOAT_FN1(tan, std::tan(x))
EB_FLOAT_FN1(asin, std::asin(x)) EB_FLOAT_FN1(acos, std::acos(x)) EB_FLOAT_FN1(atan, std::atan(x))
EB_FLOAT_FN1(sinh, std::sinh(x)) EB_FLOAT_FN1(cosh, std::cosh(x)) EB_FLOAT_FN1(tanh, std::tanh(x))
EB_FLOAT_FN1(erf, std::erf(x))
EB_FLOAT_FN1(floor, std::floor(x)) EB_FLOAT_FN1(ceil, std::ceil(x)) EB_FLOAT_FN1(round, std::round(x))
EB_FLOAT_FN1(trunc, std::trunc(x)) EB_FLOAT_FN1(rint, std::nearbyint(x)) EB_FLOAT_FN1(fract, x - std::floor(x))
EB_FLOAT_FN1(saturate, std::fmin(std::fmax(x, 0.0f), 1.0f))
EB_FLOAT_FN1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f))
#undef EB_FLOAT_FN1

template <class X> auto abs(const X& arg) {
  using T = eb::elem_t<X>;
  auto f = [](T x) { return x < T(0) ? T(-x) : x; };
  if constexpr (eb::is_vector_v<X>) return eb::zip<T>(f, arg);
  else return f(arg);
}

// Two- and three-operand functions broadcast scalars like the operators do.
#define EB_FN2(name, expr)                                                                   \
  template <class A, class B> auto name(const A& a, const B& b) {                            \
    using T = eb::result_elem<A, B>;                                                         \
    auto f = [](auto x, auto y) { return T(expr); };                                         \
    if constexpr (eb::any_vector_v<A, B>) return eb::zip<T>(f, a, b);                        \
    else return f(T(a), T(b));                                                               \
  }
EB_FN2(min, y < x ? T(y) : T(x)) EB_FN2(max, x < y ? T(y) : T(x))
EB_FN2(fmin, std::fmin(float(x), float(y))) EB_FN2(fmax, std::fmax(float(x), float(y)))
EB_FN2(pow, std::pow(float(x), float(y))) EB_FN2(powr, std::pow(float(x), float(y)))
EB_FN2(atan2, std::atan2(float(x), float(y))) EB_FN2(fmod, std::fmod(float(x), float(y)))
EB_FN2(step, float(y) < float(x) ? 0.0f : 1.0f)
EB_FN2(divide, float(x) / float(y))
#undef EB_FN2

template <class X, class L, class H> auto clamp(const X& x, const L& lo, const H& hi) { return min(max(x, lo), hi); }
template <class A, class B, class C> auto fma(const A& a, const B& b, const C& c) {
  using T = eb::elem_t<A>;
  auto f = [](auto x, auto y, auto z) { return T(std::fma(float(x), float(y), float(z))); };
  if constexpr (eb::is_vector_v<A> || eb::is_vector_v<B> || eb::is_vector_v<C>) return eb::zip<T>(f, a, b, c);
  else return f(a, b, c);
}
template <class A, class B, class C> auto mix(const A& a, const B& b, const C& t) { return a + (b - a) * t; }
template <class A, class B, class C> auto smoothstep(const A& e0, const B& e1, const C& x) {
  auto t = clamp((x - e0) / (e1 - e0), 0.0f, 1.0f);
  return t * t * (3.0f - 2.0f * t);
}
// select(a, b, c): c ? b : a, component-wise when c is a bool vector.
template <class A, class B, class C> auto select(const A& a, const B& b, const C& c) {
  using T = eb::result_elem<A, B>;
  auto f = [](auto x, auto y, auto z) { return z ? T(y) : T(x); };
  if constexpr (eb::is_vector_v<A> || eb::is_vector_v<B> || eb::is_vector_v<C>) return eb::zip<T>(f, a, b, c);
  else return f(a, b, c);
}
template <class A, class B> auto dot(const A& a, const B& b) {
  auto va = eb::as_vec(a); auto vb = eb::as_vec(b);
  eb::elem_t<A> s = 0;
  for (int i = 0; i < eb::width_v<A>; ++i) s += va.v[i] * vb.v[i];
  return s;
}
template <class A> auto length(const A& a) { return sqrt(dot(a, a)); }
template <class A, class B> auto distance(const A& a, const B& b) { return length(eb::as_vec(a) - eb::as_vec(b)); }
template <class A> auto normalize(const A& a) { return eb::as_vec(a) * rsqrt(dot(a, a)); }
template <class A, class B> auto cross(const A& a, const B& b) {
  auto u = eb::as_vec(a); auto w = eb::as_vec(b);
  return decltype(u)(u.y * w.z - u.z * w.y, u.z * w.x - u.x * w.z, u.x * w.y - u.y * w.x);
}
template <class A> bool all(const A& a) { auto v = eb::as_vec(a); for (int i = 0; i < eb::width_v<A>; ++i) if (!v.v[i]) return false; return true; }
template <class A> bool any(const A& a) { auto v = eb::as_vec(a); for (int i = 0; i < eb::width_v<A>; ++i) if (v.v[i]) return true; return false; }
template <class X> auto isnan(const X& a) {
  auto f = [](auto x) { return std::isnan(float(x)); };
  if constexpr (eb::is_vector_v<X>) return eb::zip<bool>(f, a); else return f(a);
}
template <class X> auto isinf(const X& a) {
  auto f = [](auto x) { return std::isinf(float(x)); };
  if constexpr (eb::is_vector_v<X>) return eb::zip<bool>(f, a); else return f(a);
}
template <class X> auto popcount(const X& a) {
  using T = eb::elem_t<X>;
  auto f = [](T x) { return T(__builtin_popcountll((unsigned long long)(std::make_unsigned_t<T>)x)); };
  if constexpr (eb::is_vector_v<X>) return eb::zip<T>(f, a); else return f(a);
}
template <class X> auto mulhi(const X& a, const X& b) { return X((uint64_t(a) * uint64_t(b)) >> (8 * sizeof(X))); }

// as_type<T>(x): the same bits seen as another type of the same size.
template <class To, class From> To as_type(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of the same size");
  To to;
  std::memcpy((void*)&to, (const void*)&from, sizeof(To));
  return to;
}

namespace fast { using metal::exp; using metal::exp2; using metal::log; using metal::log2; using metal::sqrt;
  using metal::rsqrt; using metal::sin; using metal::cos; using metal::tanh; using metal::pow; using metal::powr;
  using metal::divide; using metal::max; using metal::min; using metal::clamp; using metal::normalize; using metal::length; }
namespace precise { using metal::exp; using metal::exp2; using metal::log; using metal::log2; using metal::sqrt;
  using metal::rsqrt; using metal::sin; using metal::cos; using metal::tanh; using metal::pow; using metal::powr;
  using metal::divide; using metal::max; using metal::min; using metal::clamp; using metal::normalize; using metal::length; }
}  // namespace metal

// -- the lane runtime: barriers, SIMD groups ---------------------------------------------
namespace eb {
// A reusable counting barrier. It refuses to wait for lanes that already returned from the
// kernel: on a GPU that is undefined behaviour (usually a hang), here a clear failure.
struct Barrier {
  std::mutex m;
  std::condition_variable cv;
  int expected = 0, arrived = 0, exited = 0;
  unsigned long generation = 0;
  const char* what = "threadgroup_barrier";

  void reset(int count) { std::lock_guard<std::mutex> g(m); expected = count; arrived = exited = 0; }
  template <class F> void arrive_and_wait(F on_last) {
    std::unique_lock<std::mutex> lock(m);
    if (exited) divergent();
    unsigned long gen = generation;
    if (++arrived == expected) {
      on_last();
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    while (gen == generation) {
      if (cv.wait_for(lock, std::chrono::seconds(120)) == std::cv_status::timeout && gen == generation)
        fail("a barrier waited 120 s: lanes are stuck (divergent control flow around a barrier?)");
      if (exited && gen == generation) divergent();
    }
  }
  void arrive_and_wait() { arrive_and_wait([] {}); }
  void lane_exited() {
    std::lock_guard<std::mutex> g(m);
    ++exited;
    if (arrived) { cv.notify_all(); divergent(); }
  }
  [[noreturn]] void divergent() {
    char text[256];
    std::snprintf(text, sizeof text, "%s is not reached by every thread of its group: some threads returned "
                  "before others reached it (divergent control flow around a barrier)", what);
    fail(text);
  }
};

constexpr int kSimdWidth = 32;
struct SimdGroup {
  Barrier barrier;
  alignas(16) unsigned char slots[kSimdWidth][16];
  int size = 0;
};
struct LaneState {
  Barrier* threadgroup = nullptr;
  SimdGroup* simd = nullptr;
  int simd_lane = 0;
};
inline thread_local LaneState lane;

// Every lane writes its value, then reads what it needs: two barriers keep the slots stable.
template <class T, class F> T simd_exchange(const T& value, F read) {
  static_assert(sizeof(T) <= 16, "SIMD-group functions take scalars and vectors up to 16 bytes");
  SimdGroup* g = lane.simd;
  if (!g) fail("a SIMD-group function was called outside a dispatch");
  std::memcpy(g->slots[lane.simd_lane], &value, sizeof(T));
  g->barrier.arrive_and_wait();
  auto slot = [g](int i) { T t; std::memcpy((void*)&t, g->slots[i], sizeof(T)); return t; };
  T result = read(slot, lane.simd_lane, g->size);
  g->barrier.arrive_and_wait();
  return result;
}
}  // namespace eb

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }
inline void threadgroup_barrier(mem_flags = mem_flags::mem_none) {
  if (!eb::lane.threadgroup) eb::fail("threadgroup_barrier called outside a dispatch");
  eb::lane.threadgroup->arrive_and_wait();
}
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none) {
  if (!eb::lane.simd) eb::fail("simdgroup_barrier called outside a dispatch");
  eb::lane.simd->barrier.arrive_and_wait();
}

template <class T> T simd_sum(T x) {
  return eb::simd_exchange(x, [](auto slot, int, int n) { T s = slot(0); for (int i = 1; i < n; ++i) s = s + slot(i); return s; });
}
template <class T> T simd_product(T x) {
  return eb::simd_exchange(x, [](auto slot, int, int n) { T s = slot(0); for (int i = 1; i < n; ++i) s = s * slot(i); return s; });
}
template <class T> T simd_max(T x) {
  return eb::simd_exchange(x, [](auto slot, int, int n) { T s = slot(0); for (int i = 1; i < n; ++i) s = max(s, slot(i)); return s; });
}
template <class T> T simd_min(T x) {
  return eb::simd_exchange(x, [](auto slot, int, int n) { T s = slot(0); for (int i = 1; i < n; ++i) s = min(s, slot(i)); return s; });
}
template <class T> T simd_prefix_exclusive_sum(T x) {
  return eb::simd_exchange(x, [](auto slot, int me, int) { T s = T(0); for (int i = 0; i < me; ++i) s = s + slot(i); return s; });
}
template <class T> T simd_prefix_inclusive_sum(T x) {
  return eb::simd_exchange(x, [](auto slot, int me, int) { T s = slot(0); for (int i = 1; i <= me; ++i) s = s + slot(i); return s; });
}
// Lanes reading outside the active SIMD-group keep their own value.
template <class T> T simd_shuffle(T x, ushort from) {
  return eb::simd_exchange(x, [from](auto slot, int me, int n) { return slot(int(from) < n ? int(from) : me); });
}
template <class T> T simd_broadcast(T x, ushort from) {
  return eb::simd_exchange(x, [from](auto slot, int me, int n) { return slot(int(from) < n ? int(from) : me); });
}
template <class T> T simd_broadcast_first(T x) { return simd_broadcast(x, 0); }
template <class T> T simd_shuffle_down(T x, ushort delta) {
  return eb::simd_exchange(x, [delta](auto slot, int me, int n) { return slot(me + delta < n ? me + delta : me); });
}
template <class T> T simd_shuffle_up(T x, ushort delta) {
  return eb::simd_exchange(x, [delta](auto slot, int me, int) { return slot(me >= delta ? me - delta : me); });
}
template <class T> T simd_shuffle_xor(T x, ushort mask) {
  return eb::simd_exchange(x, [mask](auto slot, int me, int n) { return slot((me ^ mask) < n ? (me ^ mask) : me); });
}
inline bool simd_all(bool x) {
  return eb::simd_exchange(x, [](auto slot, int, int n) { for (int i = 0; i < n; ++i) if (!slot(i)) return false; return true; });
}
inline bool simd_any(bool x) {
  return eb::simd_exchange(x, [](auto slot, int, int n) { for (int i = 0; i < n; ++i) if (slot(i)) return true; return false; });
}
inline bool simd_is_first() { return eb::lane.simd_lane == 0; }

// -- atomics: MSL's C-style atomic functions over std::atomic --------------------------------
enum memory_order { memory_order_relaxed };
using atomic_int = std::atomic<int>;
using atomic_uint = std::atomic<uint>;
using atomic_float = std::atomic<float>;
static_assert(sizeof(atomic_uint) == 4 && sizeof(atomic_float) == 4, "atomics must overlay 32-bit buffer words");
template <class A, class T> void atomic_store_explicit(A* obj, T v, memory_order) { obj->store(v, std::memory_order_relaxed); }
template <class A> auto atomic_load_explicit(A* obj, memory_order) { return obj->load(std::memory_order_relaxed); }
template <class A, class T> auto atomic_exchange_explicit(A* obj, T v, memory_order) { return obj->exchange(v, std::memory_order_relaxed); }
template <class A, class T> auto atomic_fetch_add_explicit(A* obj, T v, memory_order) { return obj->fetch_add(v, std::memory_order_relaxed); }
template <class A, class T> auto atomic_fetch_sub_explicit(A* obj, T v, memory_order) { return obj->fetch_sub(v, std::memory_order_relaxed); }
template <class A, class T> auto atomic_fetch_and_explicit(A* obj, T v, memory_order) { return obj->fetch_and(v, std::memory_order_relaxed); }
template <class A, class T> auto atomic_fetch_or_explicit(A* obj, T v, memory_order) { return obj->fetch_or(v, std::memory_order_relaxed); }
template <class A, class T> auto atomic_fetch_xor_explicit(A* obj, T v, memory_order) { return obj->fetch_xor(v, std::memory_order_relaxed); }
template <class A, class T> auto atomic_fetch_max_explicit(A* obj, T v, memory_order) {
  auto old = obj->load(std::memory_order_relaxed);
  while (old < v && !obj->compare_exchange_weak(old, v, std::memory_order_relaxed)) {}
  return old;
}
template <class A, class T> auto atomic_fetch_min_explicit(A* obj, T v, memory_order) {
  auto old = obj->load(std::memory_order_relaxed);
  while (v < old && !obj->compare_exchange_weak(old, v, std::memory_order_relaxed)) {}
  return old;
}
template <class A, class T> bool atomic_compare_exchange_weak_explicit(A* obj, T* expected, T desired, memory_order, memory_order) {
  return obj->compare_exchange_weak(*expected, desired, std::memory_order_relaxed);
}
}  // namespace metal

#include "msl_dispatch.h"

// -- address spaces: the CPU has one, so they vanish (threadgroup locals become statics) ----
#define device
#define constant const
#define thread
#define threadgroup
