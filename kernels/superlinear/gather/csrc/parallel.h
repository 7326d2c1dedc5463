// How the compiled CPU kernels spread their work over threads.
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

// body(lo, hi) over [0, n) in slices of `slice` items, slice s on thread s % threads: later items
// cost more (more stripes, longer spans), so interleaved slices balance the threads.
template <class Body>
inline void run_interleaved(int64_t n, int64_t threads, int64_t slice, const Body& body) {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t)
        pool.emplace_back([&body, t, threads, n, slice] {
            for (int64_t lo = t * slice; lo < n; lo += threads * slice)
                body(lo, lo + slice < n ? lo + slice : n);
        });
    for (auto& th : pool) th.join();
}
