// The stripe search of the gather path (``gather/native.py``): per query and KV head, the stripe
// keys scored in place against the group's query heads, the exact top-k kept as it goes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel.h"
#include "vec8.h"

namespace {

inline int64_t ordered_bits(float s) {
    s = s + 0.0f;  // -0.0 -> +0.0
    int32_t b;
    std::memcpy(&b, &s, 4);
    return b >= 0 ? (int64_t)b : (int64_t)(b ^ 0x7FFFFFFF);
}

struct Args {
    const float* keys; const float* queries; const int64_t* positions; const int64_t* distance;
    const int64_t* count; const uint8_t* mask; int64_t* anchors; float* scores;
    int64_t key_len, kv_heads, group, dim, topk, table_len;
};

// Scores of one key row against N (1..4) query heads, N independent accumulator chains.
template <int N>
inline void dots(const float* __restrict kr, const float* __restrict q, int64_t dim, float* out) {
    v8 acc[N];
    for (int g = 0; g < N; ++g) acc[g] = v8{0, 0, 0, 0, 0, 0, 0, 0};
    int64_t d = 0;
    for (; d + 8 <= dim; d += 8) {
        const v8 kv = load8(kr + d);
        for (int g = 0; g < N; ++g) acc[g] += kv * load8(q + g * dim + d);
    }
    for (int g = 0; g < N; ++g) {
        float s = hsum(acc[g]);
        for (int64_t e = d; e < dim; ++e) s += kr[e] * q[g * dim + e];
        out[g] = s;
    }
}

inline void score_row(const float* kr, const float* q, int64_t group, int64_t dim, float* out) {
    int64_t g = 0;
    for (; g + 4 <= group; g += 4) dots<4>(kr, q + g * dim, dim, out + g);
    switch (group - g) {
        case 3: dots<3>(kr, q + g * dim, dim, out + g); break;
        case 2: dots<2>(kr, q + g * dim, dim, out + g); break;
        case 1: dots<1>(kr, q + g * dim, dim, out + g); break;
        default: break;
    }
}

constexpr int64_t QUERY_BLOCK = 64;

// Queries [lo, hi) in blocks: stripe by stripe, so that the block's keys on one stripe are
// consecutive rows (a streamed read) instead of ~sqrt(t) scattered rows per query.
void run(const Args& a, int64_t lo, int64_t hi) {
    const int64_t G = a.group, D = a.dim, K = a.topk, H = a.kv_heads;
    const int64_t per_query = H * G * K;
    std::vector<int64_t> best_key(QUERY_BLOCK * per_query);
    std::vector<int64_t> best_idx(QUERY_BLOCK * per_query);
    std::vector<float> best_score(QUERY_BLOCK * per_query);
    std::vector<int64_t> n_of(QUERY_BLOCK);
    std::vector<float> s(G);
    for (int64_t c0 = lo; c0 < hi; c0 += QUERY_BLOCK) {
        const int64_t c1 = c0 + QUERY_BLOCK < hi ? c0 + QUERY_BLOCK : hi;
        int64_t most = 0;
        for (int64_t c = c0; c < c1; ++c) {
            const int64_t p = a.positions[c];
            n_of[c - c0] = (p >= 0 && p < a.table_len) ? a.count[p] : 0;
            if (n_of[c - c0] > most) most = n_of[c - c0];
        }
        for (int64_t i = 0; i < (c1 - c0) * per_query; ++i) {
            best_key[i] = INT64_MIN; best_idx[i] = -1; best_score[i] = 0.f;
        }
        for (int64_t h = 0; h < H; ++h) {
            const float* kh = a.keys + h * a.key_len * D;
            for (int64_t j = 0; j < most; ++j) {
                for (int64_t c = c0; c < c1; ++c) {
                    if (j >= n_of[c - c0]) continue;
                    const int64_t key = a.positions[c] + 1 - a.distance[j];
                    if (key < 0 || key >= a.key_len) continue;
                    if (a.mask && !a.mask[key]) continue;
                    score_row(kh + key * D, a.queries + (c * H + h) * G * D, G, D, s.data());
                    const int64_t base = ((c - c0) * H + h) * G * K;
                    for (int64_t g = 0; g < G; ++g) {
                        // The key orders as ordered_score_key: score bits, then the stripe index
                        // (a farther stripe wins a tie); every candidate's key is distinct.
                        const int64_t ck = ordered_bits(s[g]) * (int64_t(1) << 32) + j;
                        int64_t* bk = &best_key[base + g * K];
                        if (ck <= bk[K - 1]) continue;
                        int64_t* bi = &best_idx[base + g * K];
                        float* bs = &best_score[base + g * K];
                        int64_t r = K - 1;
                        while (r > 0 && bk[r - 1] < ck) { bk[r] = bk[r - 1]; bi[r] = bi[r - 1]; bs[r] = bs[r - 1]; --r; }
                        bk[r] = ck; bi[r] = key; bs[r] = s[g];
                    }
                }
            }
        }
        for (int64_t i = 0; i < (c1 - c0) * per_query; ++i) {
            // As the torch path: a candidate scoring -inf (or NaN) is no anchor.
            const bool found = best_idx[i] >= 0 && best_score[i] > -__builtin_inff();
            a.anchors[c0 * per_query + i] = found ? best_idx[i] : -1;
            a.scores[c0 * per_query + i] = found ? best_score[i] : -__builtin_inff();
        }
    }
}

}  // namespace

extern "C" int superlinear_search(
        const float* keys, const float* queries, const int64_t* positions, const int64_t* distance,
        const int64_t* count, const uint8_t* mask, int64_t* anchors, float* scores, int64_t queries_n,
        int64_t key_len, int64_t kv_heads, int64_t group, int64_t dim, int64_t topk, int64_t table_len,
        int64_t threads) {
    Args a{keys, queries, positions, distance, count, mask, anchors, scores,
           key_len, kv_heads, group, dim, topk, table_len};
    if (threads <= 1 || queries_n < 256) { run(a, 0, queries_n); return 0; }
    // Later queries have more stripes.
    run_interleaved(queries_n, threads, 64, [&a](int64_t lo, int64_t hi) { run(a, lo, hi); });
    return 0;
}
