/*
 * copy-split: two threads share each copy of `size` KiB, in turn over `buffers` source and
 * destination pairs in shared memory (memfd, as the buffer arenas are), the way the software
 * device's copy engine shares a placed WRITE between the scheduler thread and its helper
 * (lnd/src/fabric/soft/copier.rs). The copy is cut into 64 KiB chunks, and the two threads
 * claim them either alternately (each the next chunk) or from the two ends (one from the
 * front, one from the back, until they meet), with ordinary (memcpy) and streaming stores.
 * Prints MiB/s of each of the four for `rounds` rounds:
 *
 *   gcc -O2 -mavx2 -pthread bench/copy-split.c -o /tmp/copy-split
 *   /tmp/copy-split 8 1024 2
 *
 * Each new process draws new memory, and on a virtual machine the rates can differ a lot from
 * one process to the next: run it several times.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MIB (1 << 20)
#define CHUNK (64 << 10)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Streaming stores; 32-byte aligned buffers, a multiple of 128 bytes. */
static void copy_stream(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    _mm_sfence();
}

static int buffers, stream, two_ends;
static size_t size;
static long copies;
static char *src, *dst;
/* The chunks of the current copy not yet claimed: front in the low half, back in the high. */
static _Atomic unsigned long claims;
static atomic_long posted, finished;

static void share(int id) {
    unsigned long per = size / CHUNK;
    for (long k = 0; k < copies; k++) {
        if (id == 0) {
            while (atomic_load(&finished) != 2 * k)
                ;
            atomic_store(&claims, per << 32);
            atomic_store(&posted, k + 1);
        } else {
            while (atomic_load(&posted) != k + 1)
                ;
        }
        size_t base = (size_t)(k % buffers) * size;
        for (;;) {
            unsigned long c = atomic_load(&claims), front = c & 0xffffffffUL, back = c >> 32, next, chunk;
            if (front >= back)
                break;
            if (!two_ends || id == 0) {
                next = c + 1;
                chunk = front;
            } else {
                next = c - (1UL << 32);
                chunk = back - 1;
            }
            if (!atomic_compare_exchange_weak(&claims, &c, next))
                continue;
            char *d = dst + base + chunk * CHUNK;
            const char *s = src + base + chunk * CHUNK;
            if (stream)
                copy_stream(d, s, CHUNK);
            else
                memcpy(d, s, CHUNK);
        }
        atomic_fetch_add(&finished, 1);
    }
}

static void *second(void *arg) {
    (void)arg;
    share(1);
    return NULL;
}

static char *shared_buffer(const char *name, size_t len) {
    int fd = memfd_create(name, 0);
    if (fd < 0 || ftruncate(fd, len) != 0)
        return NULL;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s BUFFERS SIZE_KIB ROUNDS\n", argv[0]);
        return 2;
    }
    buffers = atoi(argv[1]);
    size = (size_t)atoi(argv[2]) * 1024;
    int rounds = atoi(argv[3]);
    if (buffers < 1 || size < CHUNK || size % CHUNK || rounds < 1) {
        fprintf(stderr, "BUFFERS >= 1, SIZE_KIB a multiple of 64, ROUNDS >= 1\n");
        return 2;
    }
    src = shared_buffer("src", buffers * size);
    dst = shared_buffer("dst", buffers * size);
    if (!src || !dst)
        return 1;
    memset(src, 1, buffers * size);
    memset(dst, 2, buffers * size);
    for (int r = 0; r < rounds; r++) {
        printf("round %d, %d x %zu KiB:", r, buffers, size / 1024);
        for (stream = 0; stream < 2; stream++) {
            for (two_ends = 0; two_ends < 2; two_ends++) {
                copies = (long)(8e9 / size);
                atomic_store(&posted, 0);
                atomic_store(&finished, 0);
                double t = now();
                pthread_t p;
                pthread_create(&p, NULL, second, NULL);
                share(0);
                pthread_join(p, NULL);
                printf("  %s %s %.0f", stream ? "stream" : "memcpy", two_ends ? "two-ends" : "alternate",
                       (double)copies * size / (now() - t) / MIB);
            }
        }
        printf(" MiB/s\n");
    }
    return 0;
}
