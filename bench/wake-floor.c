/*
 * wake-floor: two processes bounce a 16-byte message, each sleeping in epoll_wait until it
 * arrives, through a UDP datagram on loopback (what the software device's ring doorbell is)
 * and through a FIFO (a named pipe: what a same-host wake-up could be without the UDP stack;
 * an eventfd cannot be opened by another process by name, `open("/proc/<pid>/fd/<n>")` gives
 * ENXIO, so it would have to be passed over a Unix socket). Prints the round trip of each.
 * It is the measurement behind the README's note on the doorbell ("Waking a sleeping
 * scheduler"):
 *
 *   gcc -O2 bench/wake-floor.c -o /tmp/wake-floor
 *   /tmp/wake-floor            # the two processes on any cores (each wake-up crosses cores)
 *   taskset -c 0 /tmp/wake-floor   # both on one core
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 20000

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int waiter(int fd) {
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) != 0) {
        perror("epoll");
        exit(1);
    }
    return ep;
}

static void wait_for(int ep, int fd, char *buf) {
    struct epoll_event e;
    while (read(fd, buf, 16) != 16) {
        epoll_wait(ep, &e, 1, -1);
    }
}

static double udp_round_trip(void) {
    int a = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    int b = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET}, sb = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    inet_pton(AF_INET, "127.0.0.2", &sb.sin_addr);
    socklen_t len = sizeof sa;
    if (bind(a, (void *)&sa, len) || bind(b, (void *)&sb, len) || getsockname(a, (void *)&sa, &len) ||
        getsockname(b, (void *)&sb, &len)) {
        perror("udp");
        exit(1);
    }
    char buf[16] = "LNDBELL1nonce123";
    pid_t child = fork();
    if (child == 0) {
        int ep = waiter(b);
        for (int i = 0; i < ROUNDS; i++) {
            wait_for(ep, b, buf);
            sendto(b, buf, 16, 0, (void *)&sa, sizeof sa);
        }
        _exit(0);
    }
    int ep = waiter(a);
    double t0 = now_us();
    for (int i = 0; i < ROUNDS; i++) {
        sendto(a, buf, 16, 0, (void *)&sb, sizeof sb);
        wait_for(ep, a, buf);
    }
    double rtt = (now_us() - t0) / ROUNDS;
    waitpid(child, NULL, 0);
    return rtt;
}

static double fifo_round_trip(void) {
    char there[] = "/tmp/wake-floor-XXXXXX";
    if (!mkdtemp(there)) {
        perror("mkdtemp");
        exit(1);
    }
    char f1[64], f2[64];
    snprintf(f1, sizeof f1, "%s/a", there);
    snprintf(f2, sizeof f2, "%s/b", there);
    if (mkfifo(f1, 0600) || mkfifo(f2, 0600)) {
        perror("mkfifo");
        exit(1);
    }
    char buf[16] = "LNDBELL1nonce123";
    pid_t child = fork();
    if (child == 0) {
        int r = open(f2, O_RDWR | O_NONBLOCK), w = open(f1, O_RDWR | O_NONBLOCK);
        int ep = waiter(r);
        for (int i = 0; i < ROUNDS; i++) {
            wait_for(ep, r, buf);
            if (write(w, buf, 16) != 16) _exit(1);
        }
        _exit(0);
    }
    int w = open(f2, O_RDWR | O_NONBLOCK), r = open(f1, O_RDWR | O_NONBLOCK);
    int ep = waiter(r);
    double t0 = now_us();
    for (int i = 0; i < ROUNDS; i++) {
        if (write(w, buf, 16) != 16) exit(1);
        wait_for(ep, r, buf);
    }
    double rtt = (now_us() - t0) / ROUNDS;
    waitpid(child, NULL, 0);
    unlink(f1);
    unlink(f2);
    rmdir(there);
    return rtt;
}

int main(void) {
    for (int run = 0; run < 3; run++) {
        double udp = udp_round_trip(), fifo = fifo_round_trip();
        printf("round trip, both sleeping: UDP datagram %.1f us, FIFO %.1f us\n", udp, fifo);
    }
    return 0;
}
