// The span attention of a prefill chunk (``gather/native_spans.py``): each (query, span) pair over
// its own span, key and value rows read in place, pairs grouped so a key block is read once per group.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "parallel.h"
#include "vec8.h"

namespace {

typedef int32_t v8i __attribute__((vector_size(32)));

inline void store8(float* p, v8 a) { __builtin_memcpy(p, &a, sizeof a); }
inline v8 splat(float x) { return v8{x, x, x, x, x, x, x, x}; }

// The 8 horizontal sums of a[0..7], as one vector.
inline v8 hsum8(const v8* a) {
#if defined(__AVX__)
    __m256 t0 = _mm256_hadd_ps((__m256)a[0], (__m256)a[1]);
    __m256 t1 = _mm256_hadd_ps((__m256)a[2], (__m256)a[3]);
    __m256 t2 = _mm256_hadd_ps((__m256)a[4], (__m256)a[5]);
    __m256 t3 = _mm256_hadd_ps((__m256)a[6], (__m256)a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1);
    __m256 u1 = _mm256_hadd_ps(t2, t3);
    return (v8)_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
#else
    v8 r;
    for (int j = 0; j < 8; ++j) {
        float s = 0.f;
        for (int e = 0; e < 8; ++e) s += a[j][e];
        r[j] = s;
    }
    return r;
#endif
}

// exp(x) for x <= 0 (Cephes expf polynomial); exactly 0 below -87 (and for -inf / NaN).
inline v8 vexp(v8 x) {
    const v8i keep = x > splat(-87.f);
    x = x < splat(-87.f) ? splat(-87.f) : x;
    x = x > splat(0.f) ? splat(0.f) : x;
    const v8 magic = splat(12582912.f);  // 1.5 * 2^23: round to nearest
    v8 t = x * splat(1.44269504088896341f) + magic;
    const v8 n = t - magic;
    v8i ni = (v8i)t - (v8i)magic;
    x = x - n * splat(0.693359375f);
    x = x - n * splat(-2.12194440e-4f);
    v8 y = splat(1.9875691500E-4f);
    y = y * x + splat(1.3981999507E-3f);
    y = y * x + splat(8.3334519073E-3f);
    y = y * x + splat(4.1665795894E-2f);
    y = y * x + splat(1.6666665459E-1f);
    y = y * x + splat(5.0000001201E-1f);
    y = y * (x * x) + x + splat(1.f);
    const v8i pow2 = (ni + 127) << 23;
    v8 r = y * (v8)pow2;
    return (v8)((v8i)r & keep);
}

inline float hmax(v8 a) {
    float m = a[0];
    for (int j = 1; j < 8; ++j) m = a[j] > m ? a[j] : m;
    return m;
}

struct Args {
    const float* queries; const float* keys; const float* values; const int64_t* lo; const int64_t* hi;
    const int64_t* order; const uint8_t* mask; float* lse; float* out;
    int64_t key_len, pairs_per_head, topk, dim; float scale; int64_t group_size;
};

constexpr float NEG_INF = -__builtin_inff();

// Keys come in blocks of KB = 16, transposed ([D, 16] per block: keys_t), so that the scores of a
// few queries against a block are a register-tiled product: per d, two loads of 8 keys and one
// broadcast per query feed 2 FMAs per query (no horizontal sums).
constexpr int KB = 16;
constexpr int MQ = 6;  // queries per score tile (12 accumulators)

template <int NV>
inline void scores4(const float* const* q, const float* kt, int64_t D_, v8 (*out)[2]) {
    const int64_t D = NV ? NV * 8 : D_;
    v8 acc[MQ][2];
    for (int g = 0; g < MQ; ++g) acc[g][0] = acc[g][1] = splat(0.f);
    for (int64_t d = 0; d < D; ++d) {
        const v8 k0 = load8(kt + d * KB);
        const v8 k1 = load8(kt + d * KB + 8);
        for (int g = 0; g < MQ; ++g) {
            const v8 b = splat(q[g][d]);
            acc[g][0] += b * k0;
            acc[g][1] += b * k1;
        }
    }
    for (int g = 0; g < MQ; ++g) { out[g][0] = acc[g][0]; out[g][1] = acc[g][1]; }
}

// One pair's online-softmax step over the block [k0, k0 + 16) given its raw scores s (keys outside
// its span [lo, hi] or masked get weight 0): m, l and acc[D] (rescaled) updated, the block's weights
// in pr; false if no key of the block counts (nothing to add).
inline bool softmax_step(const Args& a, v8* s, int64_t k0, int64_t lo, int64_t hi, float& m, float& l, float* acc,
                         float* pr) {
    const int64_t D = a.dim;
    const int64_t first = lo - k0;  // keys k0 + first .. k0 + last are in the span
    const int64_t last = hi - k0;
    const int j0 = first > 0 ? (int)first : 0;
    const int j1 = last < KB - 1 ? (int)last : KB - 1;
    const bool full = j0 == 0 && j1 == KB - 1;
    s[0] *= splat(a.scale);
    s[1] *= splat(a.scale);
    if (!full) {
        const v8i iota = v8i{0, 1, 2, 3, 4, 5, 6, 7};
        for (int h = 0; h < 2; ++h) {
            const v8i idx = iota + h * 8;
            const v8i inside = (idx >= j0) & (idx <= j1);
            s[h] = inside ? s[h] : splat(NEG_INF);
        }
    }
    if (a.mask) {
        for (int j = j0; j <= j1; ++j)
            if (!a.mask[k0 + j]) s[j >> 3][j & 7] = NEG_INF;
    }
    const float mb = hmax(s[0] > s[1] ? s[0] : s[1]);
    if (!(mb > NEG_INF)) return false;
    if (mb > m) {
        const float corr = m > NEG_INF ? std::exp(m - mb) : 0.f;
        l *= corr;
        const v8 c = splat(corr);
        for (int64_t d = 0; d < D; d += 8) store8(acc + d, load8(acc + d) * c);
        m = mb;
    }
    const v8 p0 = vexp(s[0] - splat(m));
    const v8 p1 = vexp(s[1] - splat(m));
    l += hsum(p0 + p1);
    store8(pr, p0);
    store8(pr + 8, p1);
    return true;
}

// acc_a[D] += sum_j pa[j] V[j], acc_b likewise (16 rows of V from vr, zero weights outside the
// spans): chunks of 32 columns, 8 accumulators, each V load feeding two pairs.
inline void pv2(const float* vr, const float* pa, const float* pb, float* xa, float* xb, int64_t D) {
    for (int64_t c = 0; c < D; c += 32) {
        v8 ya[4], yb[4];
        for (int e = 0; e < 4; ++e) { ya[e] = load8(xa + c + e * 8); yb[e] = load8(xb + c + e * 8); }
        for (int j = 0; j < KB; ++j) {
            const v8 wa = splat(pa[j]), wb = splat(pb[j]);
            for (int e = 0; e < 4; ++e) {
                const v8 v = load8(vr + j * D + c + e * 8);
                ya[e] += wa * v;
                yb[e] += wb * v;
            }
        }
        for (int e = 0; e < 4; ++e) { store8(xa + c + e * 8, ya[e]); store8(xb + c + e * 8, yb[e]); }
    }
}

inline void pv1(const float* vr, const float* pa, float* xa, int64_t D) {
    for (int64_t d = 0; d < D; d += 8) {
        v8 x = load8(xa + d);
        for (int j = 0; j < KB; ++j) x += splat(pa[j]) * load8(vr + j * D + d);
        store8(xa + d, x);
    }
}

constexpr int64_t GROUP = 64;  // most pairs per group (group_size <= GROUP)

// Sorted pairs [lo, hi) in groups of up to group_size pairs of one KV head: the group walks the
// union of its spans in blocks of 16 keys; the pairs whose span meets a block get their scores in
// tiles of MQ queries and take their softmax / PV step while the block's rows are in L1.
template <int NV>
void run_t(const Args& a, int64_t lo, int64_t hi) {
    const int64_t D = a.dim;
    const int64_t nb = (a.key_len + KB - 1) / KB;
    std::vector<float> acc(GROUP * D);
    float m[GROUP], l[GROUP];
    int64_t pid[GROUP], plo[GROUP], phi[GROUP];
    const float* pq[GROUP];
    int act[GROUP + MQ];
    int64_t i = lo;
    while (i < hi) {
        const int64_t head = a.order[i] / a.pairs_per_head;
        int n = 0;
        int64_t glo = INT64_MAX, ghi = -1;
        for (; i < hi && n < a.group_size && a.order[i] / a.pairs_per_head == head; ++i) {
            const int64_t p = a.order[i];
            const int64_t s0 = a.lo[p] < 0 ? 0 : a.lo[p];
            const int64_t s1 = a.hi[p] < a.key_len ? a.hi[p] : a.key_len - 1;
            if (s1 < s0) {
                a.lse[p] = NEG_INF;
                std::memset(a.out + p * D, 0, D * sizeof(float));
                continue;
            }
            pid[n] = p; plo[n] = s0; phi[n] = s1; pq[n] = a.queries + (p / a.topk) * D;
            m[n] = NEG_INF; l[n] = 0.f;
            std::memset(acc.data() + n * D, 0, D * sizeof(float));
            glo = s0 < glo ? s0 : glo;
            ghi = s1 > ghi ? s1 : ghi;
            ++n;
        }
        if (n == 0) continue;
        const float* KT = a.keys + head * nb * KB * D;
        const float* V = a.values + head * nb * KB * D;
        for (int64_t k0 = glo / KB * KB; k0 <= ghi; k0 += KB) {
            const float* kt = KT + (k0 / KB) * KB * D;
            const float* vr = V + k0 * D;  // values padded to whole blocks: 16 rows readable
            int na = 0;
            for (int g = 0; g < n; ++g)
                if (phi[g] >= k0 && plo[g] <= k0 + KB - 1) act[na++] = g;
            for (int t = 0; t < na; t += MQ) {
                const float* qs[MQ];
                for (int u = 0; u < MQ; ++u) qs[u] = pq[act[t + u < na ? t + u : na - 1]];
                v8 sc[MQ][2];
                scores4<NV>(qs, kt, D, sc);
                float pr[MQ][KB];
                int live[MQ], nl = 0;
                for (int u = 0; u < MQ && t + u < na; ++u) {
                    const int g = act[t + u];
                    if (softmax_step(a, sc[u], k0, plo[g], phi[g], m[g], l[g], acc.data() + g * D, pr[u]))
                        live[nl++] = u;
                }
                int u = 0;
                if (D % 32 == 0)
                    for (; u + 1 < nl; u += 2)
                        pv2(vr, pr[live[u]], pr[live[u + 1]], acc.data() + act[t + live[u]] * D,
                            acc.data() + act[t + live[u + 1]] * D, D);
                for (; u < nl; ++u) pv1(vr, pr[live[u]], acc.data() + act[t + live[u]] * D, D);
            }
        }
        for (int g = 0; g < n; ++g) {
            float* o = a.out + pid[g] * D;
            const float* x = acc.data() + g * D;
            if (!(l[g] > 0.f)) {
                a.lse[pid[g]] = NEG_INF;
                std::memset(o, 0, D * sizeof(float));
                continue;
            }
            a.lse[pid[g]] = m[g] + std::log(l[g]);
            const v8 inv = splat(1.f / l[g]);
            for (int64_t d = 0; d < D; d += 8) store8(o + d, load8(x + d) * inv);
        }
    }
}

void run(const Args& a, int64_t lo, int64_t hi) {
    switch (a.dim) {
        case 32: run_t<4>(a, lo, hi); break;
        case 64: run_t<8>(a, lo, hi); break;
        case 128: run_t<16>(a, lo, hi); break;
        default: run_t<0>(a, lo, hi); break;
    }
}

}  // namespace

extern "C" int superlinear_span_partials(
        const float* queries, const float* keys, const float* values, const int64_t* lo, const int64_t* hi,
        const int64_t* order, const uint8_t* mask, float* lse, float* out, int64_t pairs, int64_t key_len,
        int64_t pairs_per_head, int64_t topk, int64_t dim, float scale, int64_t group_size, int64_t threads) {
    if (dim % 8 != 0) return 1;
    Args a{queries, keys, values, lo, hi, order, mask, lse, out, key_len, pairs_per_head, topk, dim, scale,
           group_size < 1 ? 1 : (group_size > GROUP ? GROUP : group_size)};
    if (threads <= 1 || pairs < 4096) { run(a, 0, pairs); return 0; }
    // Slices of the sorted order: each keeps its neighbours' rows in cache, and the long spans of
    // late queries spread over the threads.
    run_interleaved(pairs, threads, 1024, [&a](int64_t lo, int64_t hi) { run(a, lo, hi); });
    return 0;
}
