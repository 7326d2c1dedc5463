"""A small compiled CPU kernel for the stripe search, built at first use; the torch path otherwise.

The torch search (``search.search_rows``) gathers each query's stripe keys into a buffer (~2 GB of
row copies at 32K), multiplies, then runs several max passes for the exact top-k.  This kernel does
the same per query in one pass without copies: for each KV head it reads the stripe keys in place,
scores them against the G query heads of the group (fp32, 16-lane accumulators) and keeps the
top-k by ``attention_spans.ordered_score_key``'s order (higher score; on equal scores the farther
stripe) while it goes.  Results equal the torch path's up to fp32 summation order.

It is plain C++ (no torch headers: a compile takes about a second), built with the system's
``c++``/``g++`` into ``<TOOLKIT_CACHE_DIR or ~/.cache/toolkit>/superlinear-native/`` under a name
keyed by the source, the compiler and the CPU, and called through ``ctypes`` on tensors' data
pointers.  Without a compiler (or if the build fails) the gather path keeps its torch search and
one warning line says why.  ``TOOLKIT_SUPERLINEAR_NATIVE=0`` turns the kernel off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

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

typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) { v8 r; __builtin_memcpy(&r, p, sizeof r); return r; }

inline float hsum(v8 a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

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
    // Later queries have more stripes: interleaved slices balance the threads.
    const int64_t slice = 64;
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t)
        pool.emplace_back([&a, t, threads, queries_n, slice] {
            for (int64_t lo = t * slice; lo < queries_n; lo += threads * slice)
                run(a, lo, lo + slice < queries_n ? lo + slice : queries_n);
        });
    for (auto& th : pool) th.join();
    return 0;
}
"""

FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC", "-pthread"]



def cache_dir() -> Path:
    root = os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit"
    return Path(root).expanduser() / "superlinear-native"


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        return next((line for line in text.splitlines() if line.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor()


def compile_source(source: str, stem: str) -> Path:
    """The shared library built from ``source`` (cached under ``cache_dir()`` by a name keyed by the
    source, the compiler, the flags and the CPU); raises RuntimeError with one line if it cannot."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++) on PATH")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    digest = hashlib.sha256("\0".join([source, version, " ".join(FLAGS), platform.machine(), _cpu_id()])
                            .encode()).hexdigest()[:16]
    target = cache_dir() / f"{stem}-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / f"{stem}.cpp"
            src.write_text(source)
            built = Path(tmp) / f"{stem}.so"
            proc = subprocess.run([cxx, *FLAGS, str(src), "-o", str(built)], capture_output=True, text=True,
                                  timeout=300)
            if proc.returncode != 0:
                first = (proc.stderr.strip().splitlines() or ["no output"])[0]
                raise RuntimeError(f"{Path(cxx).name} failed: {first}")
            os.replace(built, target)  # atomic: concurrent builders leave one complete file
    return target


def _build() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(compile_source(SOURCE, "search")))
    fn = lib.superlinear_search
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_int64] * 8
    return lib


def enabled() -> bool:
    return os.environ.get("TOOLKIT_SUPERLINEAR_NATIVE", "1") not in ("0", "", "false", "no")


class LazyKernel:
    """A compiled kernel loaded at first use: the library, or None when turned off
    (``TOOLKIT_SUPERLINEAR_NATIVE=0``), when ``requires`` is None, or when the build fails (one
    warning line naming ``what`` and the torch path taken instead; not tried again until ``reset``)."""

    def __init__(self, build, what: str, fallback: str, requires=None):
        self._build, self._what, self._fallback, self._requires = build, what, fallback, requires
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self.why_not: str | None = None

    def library(self) -> ctypes.CDLL | None:
        if not enabled() or (self._requires is not None and self._requires() is None):
            return None
        if self._tried:
            return self._lib
        with self._lock:
            if not self._tried:
                try:
                    self._lib = self._build()
                except Exception as exc:  # any failure: the torch path, one warning line
                    self.why_not = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    warnings.warn(f"superlinear: {self._what} unavailable ({self.why_not}); using the "
                                  f"{self._fallback}", RuntimeWarning, stacklevel=4)
                self._tried = True
        return self._lib

    def reset(self) -> None:
        with self._lock:
            self._lib, self._tried, self.why_not = None, False, None


KERNELS: list[LazyKernel] = []  # every kernel built with compile_source (reset forgets them all)
_search = LazyKernel(lambda: _build(), "compiled CPU search", "torch search")
KERNELS.append(_search)


def library() -> ctypes.CDLL | None:
    """The compiled search kernel, or None (turned off, or not buildable here: warned once)."""
    return _search.library()


def why_not() -> str | None:
    """Why the last build attempt failed (None if it worked or was not tried)."""
    return _search.why_not


def reset() -> None:
    """Forget the loaded kernels (tests: rebuild, or simulate a machine without a compiler)."""
    for kernel in KERNELS:
        kernel.reset()


def usable(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors) and library() is not None


def native_search(q_by_query: torch.Tensor, keys_flat: torch.Tensor, key_len: int, positions: torch.Tensor,
                  distance: torch.Tensor, count: torch.Tensor, mask: torch.Tensor | None, topk: int):
    """Top-k anchors and scores ``[C, H_KV, G, k]`` (anchors -1 / scores -inf = none), best first.

    q_by_query ``[C, H_KV, G, D]`` fp32; keys_flat ``[H_KV * key_len, D]`` fp32; positions ``[C]``;
    distance ``[S]`` (``F`` of each stripe, nearest first) and count (stripes per position) int64;
    mask ``[key_len]`` bool or None.
    """
    lib = library()
    count_q, kv_heads, group, dim = q_by_query.shape
    q = q_by_query.contiguous()
    k = keys_flat.contiguous()
    pos = positions.to(torch.int64).contiguous()
    dist = distance.to(torch.int64).contiguous()
    cnt = count.to(torch.int64).contiguous()
    m = None if mask is None else mask.to(torch.uint8).contiguous()
    anchors = torch.empty((count_q, kv_heads, group, topk), dtype=torch.int64)
    scores = torch.empty((count_q, kv_heads, group, topk), dtype=torch.float32)
    lib.superlinear_search(k.data_ptr(), q.data_ptr(), pos.data_ptr(), dist.data_ptr(),
                           cnt.data_ptr(), None if m is None else m.data_ptr(), anchors.data_ptr(),
                           scores.data_ptr(), count_q, key_len, kv_heads, group, dim, topk, cnt.numel(),
                           torch.get_num_threads())
    return anchors, scores
