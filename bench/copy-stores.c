/*
 * copy-stores: one thread copies `size` KiB at a time over `buffers` rotating source and
 * destination buffers, for one second each with memcpy, with non-temporal (streaming) AVX2
 * stores, and with ordinary AVX2 stores, and prints MiB/s. It is the measurement behind the
 * software device's streaming budget (lnd/src/fabric/soft/streaming.rs, README "Streaming
 * stores once the buffers outgrow the cache"):
 *
 *   gcc -O2 -mavx2 bench/copy-stores.c -o /tmp/copy-stores
 *   for n in 1 8 32; do /tmp/copy-stores $n 1024; done
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB (1 << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Both copies need 32-byte aligned buffers and a multiple of 128 bytes. */
static void copy_avx(char *d, const char *s, size_t n, int stream) {
    for (size_t i = 0; i < n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        if (stream) {
            _mm256_stream_si256((__m256i *)(d + i), a);
            _mm256_stream_si256((__m256i *)(d + i + 32), b);
            _mm256_stream_si256((__m256i *)(d + i + 64), c);
            _mm256_stream_si256((__m256i *)(d + i + 96), e);
        } else {
            _mm256_store_si256((__m256i *)(d + i), a);
            _mm256_store_si256((__m256i *)(d + i + 32), b);
            _mm256_store_si256((__m256i *)(d + i + 64), c);
            _mm256_store_si256((__m256i *)(d + i + 96), e);
        }
    }
    if (stream)
        _mm_sfence();
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s BUFFERS SIZE_KIB\n", argv[0]);
        return 2;
    }
    int nb = atoi(argv[1]);
    size_t sz = (size_t)atoi(argv[2]) * 1024;
    if (nb < 1 || sz < 128 || sz % 128) {
        fprintf(stderr, "BUFFERS >= 1, SIZE_KIB >= 1\n");
        return 2;
    }
    char *src = aligned_alloc(4096, nb * sz), *dst = aligned_alloc(4096, nb * sz);
    if (!src || !dst)
        return 1;
    memset(src, 1, nb * sz);
    memset(dst, 2, nb * sz);
    const char *names[] = {"memcpy", "stream", "avx"};
    for (int m = 0; m < 3; m++) {
        double t = now();
        long bytes = 0;
        for (long k = 0; now() - t < 1.0;) {
            for (int j = 0; j < 16; j++, k++) {
                char *d = dst + (k % nb) * sz;
                const char *s = src + (k % nb) * sz;
                if (m == 0)
                    memcpy(d, s, sz);
                else
                    copy_avx(d, s, sz, m == 1);
                bytes += sz;
            }
        }
        printf("%-6s buffers %d x %zu KiB: %.0f MiB/s\n", names[m], nb, sz / 1024, bytes / (now() - t) / MIB);
    }
    return 0;
}
