// cudaemu.cpp - the emulator's runtime: fibers and their scheduler, streams, memory, cuBLAS.
// Settings (environment):
//   CUDAEMU_SCHED=fwd|rev|rand   order in which a block's threads run between sync points
//   CUDAEMU_BLOCKS=fwd|rev|rand  order of a grid's blocks
//   CUDAEMU_SEED=n               seed of the rand orders
//   CUDAEMU_ASYNC=0|1            1 (default): streams are deferred queues; 0: everything runs at once
//   CUDAEMU_SM_COUNT=n           multiProcessorCount reported (default 132, an H100 SXM)
//   CUDAEMU_DEVICES=n            devices reported (default 1, at most 64)
//   CUDAEMU_P2P=0|1              cudaDeviceCanAccessPeer between devices (default 0, as RTX 4090s)
//   CUDAEMU_STATS=1              per-kernel launch counts at exit
//   CUDAEMU_KEEPGOING=1          report problems but do not abort
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cublas_v2.h"
#include "cudaemu.h"
#include "nccl.h"

#if defined(__SANITIZE_ADDRESS__)
#define CUDAEMU_ASAN 1
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
extern "C" void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#else
#define CUDAEMU_ASAN 0
#endif

extern "C" void cudaemu_switch(void **save_sp, void *new_sp);
asm(R"(
.text
.globl cudaemu_switch
.type cudaemu_switch,@function
cudaemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size cudaemu_switch, .-cudaemu_switch
)");

namespace cudaemu {

enum State { READY, BARRIER, SHFL, DONE };

struct Thread {
    void *sp;
    unsigned char *stack;
    size_t stack_size;
    uint3 tid;
    unsigned lin;
    State st;
    const void *site;
    unsigned mask;
    uint64_t val, result;
    int mode, arg, width;
    void *fake;
};

CUDAEMU_TLS Thread *cur_thread;
CUDAEMU_TLS Block *cur_block;
CUDAEMU_TLS uint3 cur_tid;

static const size_t STACK = 128 * 1024;
static std::vector<Thread> threads;
static unsigned char *stack_area;
static void *sched_sp;
#if CUDAEMU_ASAN  // ASan's record of the scheduler's stack, for its fiber switches
static void *sched_fake;
static const void *sched_bottom;
static size_t sched_size;
#endif
static const std::function<void()> *cur_body;
static const char *cur_kernel;
static const char *cur_file;
static int cur_line;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}
static int order_mode_read(const char *name) {
    const char *v = getenv(name);
    if (!v || !strcmp(v, "fwd")) return 0;
    if (!strcmp(v, "rev")) return 1;
    return 2;
}
// Read once: run_block asks at every block.
static int order_mode(const char *name) {
    static const int sched = order_mode_read("CUDAEMU_SCHED"), blocks = order_mode_read("CUDAEMU_BLOCKS");
    return strcmp(name, "CUDAEMU_SCHED") == 0 ? sched : blocks;
}
static std::mt19937_64 &rng() {
    static std::mt19937_64 r((uint64_t)env_int("CUDAEMU_SEED", 1));
    return r;
}

static int problems;
void report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudaemu: ");
    if (cur_kernel) {
        fprintf(stderr, "%s (launched at %s:%d)", cur_kernel, cur_file, cur_line);
        if (cur_block)
            fprintf(stderr, " block (%u,%u,%u)", cur_block->idx.x, cur_block->idx.y, cur_block->idx.z);
        fprintf(stderr, ": ");
    }
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    problems++;
    if (!env_int("CUDAEMU_KEEPGOING", 0)) abort();
}

unsigned char *dyn_smem() { return cur_block->dyn_smem; }

// ---- fibers ----

static void yield_to_scheduler(bool dying) {
    Thread *t = cur_thread;
#if CUDAEMU_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &t->fake, sched_bottom, sched_size);
#else
    (void)dying;
#endif
    cudaemu_switch(&t->sp, sched_sp);
#if CUDAEMU_ASAN
    __sanitizer_finish_switch_fiber(t->fake, &sched_bottom, &sched_size);
#endif
    cur_thread = t;
    cur_tid = t->tid;
}

static void trampoline() {
#if CUDAEMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &sched_bottom, &sched_size);
#endif
    (*cur_body)();
    cur_thread->st = DONE;
    yield_to_scheduler(true);
    abort();  // never resumed
}

static void resume(Thread *t) {
    cur_thread = t;
    cur_tid = t->tid;
#if CUDAEMU_ASAN
    __sanitizer_start_switch_fiber(&sched_fake, t->stack, t->stack_size);
#endif
    cudaemu_switch(&sched_sp, t->sp);
#if CUDAEMU_ASAN
    __sanitizer_finish_switch_fiber(sched_fake, nullptr, nullptr);
#endif
    cur_thread = nullptr;
}

static void init_fiber(Thread *t) {
#if CUDAEMU_ASAN
    __asan_unpoison_memory_region(t->stack, t->stack_size);
#endif
    uintptr_t top = ((uintptr_t)t->stack + t->stack_size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                        // the trampoline's return address slot (never used)
    *--sp = (uint64_t)&trampoline;  // where cudaemu_switch's ret goes
    for (int i = 0; i < 6; i++) *--sp = 0;
    t->sp = sp;
    t->st = READY;
    t->fake = nullptr;
}

void syncthreads(const void *site) {
    if (!cur_thread) {
        report("__syncthreads outside a kernel");
        return;
    }
    cur_thread->st = BARRIER;
    cur_thread->site = site;
    yield_to_scheduler(false);
}

uint64_t shfl(unsigned mask, uint64_t v, int mode, int arg, int width, const void *site) {
    Thread *t = cur_thread;
    if (!t) {
        report("shuffle outside a kernel");
        return v;
    }
    if (width <= 0 || width > 32 || (width & (width - 1))) report("shuffle width %d at %s", width, (const char *)site);
    unsigned lane = t->lin % 32;
    if (!(mask & (1u << lane)))
        report("thread %u executes a shuffle at %s whose mask 0x%08x excludes its own lane %u", t->lin,
               (const char *)site, mask, lane);
    t->st = SHFL;
    t->site = site;
    t->mask = mask;
    t->val = v;
    t->mode = mode;
    t->arg = arg;
    t->width = width;
    yield_to_scheduler(false);
    return t->result;
}

static const char *state_name(const Thread &t) {
    switch (t.st) {
    case READY: return "running";
    case BARRIER: return "__syncthreads";
    case SHFL: return "shuffle";
    default: return "exited";
    }
}

// One block, every thread to its end.
static long long barrier_after_exit;
static void run_block(unsigned n) {
    int mode = order_mode("CUDAEMU_SCHED");
    std::vector<unsigned> order(n);
    for (unsigned i = 0; i < n; i++) order[i] = i;
    for (unsigned i = 0; i < n; i++) init_fiber(&threads[i]);
    unsigned n_done = 0;
    for (;;) {
        if (mode == 1) std::reverse(order.begin(), order.end());
        if (mode == 2) std::shuffle(order.begin(), order.end(), rng());
        for (unsigned i : order)
            if (threads[i].st == READY) resume(&threads[i]);
        n_done = 0;
        for (unsigned i = 0; i < n; i++) n_done += threads[i].st == DONE;
        if (n_done == n) break;
        // warp shuffles
        bool progress = false;
        for (unsigned w0 = 0; w0 < n; w0 += 32) {
            unsigned w1 = std::min(n, w0 + 32);
            bool any = false;
            for (unsigned i = w0; i < w1; i++) any |= threads[i].st == SHFL;
            if (!any) continue;
            // Every lane named in a waiting lane's mask must wait at the same shuffle (site, mask,
            // mode, width). Lanes with the same mask form one group, checked once: O(32) per group.
            bool ok = true;
            unsigned checked = 0;  // masks already checked
            for (unsigned i = w0; i < w1 && ok; i++) {
                Thread &a = threads[i];
                if (a.st != SHFL || (checked & (1u << (i - w0)))) continue;
                for (unsigned l = 0; l < 32 && ok; l++) {
                    if (!(a.mask & (1u << l))) continue;
                    unsigned j = w0 + l;
                    if (j >= n) {
                        report("thread %u: shuffle at %s names lane %u, past the block's %u threads", a.lin,
                               (const char *)a.site, l, n);
                        ok = false;
                        break;
                    }
                    Thread &b = threads[j];
                    if (b.st != SHFL) {
                        report("warp divergence: thread %u waits at the shuffle at %s (mask 0x%08x) but lane %u "
                               "(thread %u) is at %s%s%s",
                               a.lin, (const char *)a.site, a.mask, l, j, state_name(b),
                               b.st == BARRIER ? " at " : "", b.st == BARRIER ? (const char *)b.site : "");
                        ok = false;
                        break;
                    }
                    if (b.site != a.site || b.mask != a.mask || b.mode != a.mode || b.width != a.width) {
                        report("warp divergence: lanes of one warp at different shuffles: thread %u at %s (mask "
                               "0x%08x), thread %u at %s (mask 0x%08x)",
                               a.lin, (const char *)a.site, a.mask, j, (const char *)b.site, b.mask);
                        ok = false;
                        break;
                    }
                    checked |= 1u << l;
                }
            }
            if (!ok) {  // (only with CUDAEMU_KEEPGOING) release them with their own values
                for (unsigned i = w0; i < w1; i++)
                    if (threads[i].st == SHFL) threads[i].result = threads[i].val, threads[i].st = READY;
                progress = true;
                continue;
            }
            for (unsigned i = w0; i < w1; i++) {
                Thread &a = threads[i];
                if (a.st != SHFL) continue;
                int lane = (int)(a.lin % 32), w = a.width, seg = lane / w * w, src = lane;
                switch (a.mode) {
                case 0: src = lane ^ a.arg; break;
                case 1: src = seg + (a.arg % w); break;
                case 2: src = lane + a.arg; break;
                case 3: src = lane - a.arg; break;
                }
                if (src < seg || src >= seg + w) src = lane;  // out of the segment: own value
                if (!(a.mask & (1u << src))) {
                    report("thread %u: shuffle at %s reads lane %d, outside its mask 0x%08x (undefined)", a.lin,
                           (const char *)a.site, src, a.mask);
                    src = lane;
                }
                a.result = threads[w0 + src].val;
            }
            for (unsigned i = w0; i < w1; i++)
                if (threads[i].st == SHFL) threads[i].st = READY;
            progress = true;
        }
        if (progress) continue;
        // a block barrier: every live thread at it, at one site
        const void *site = nullptr;
        bool all = true;
        for (unsigned i = 0; i < n; i++) {
            Thread &a = threads[i];
            if (a.st == DONE) continue;
            if (a.st != BARRIER) {
                all = false;
                break;
            }
            if (!site) site = a.site;
            else if (a.site != site)
                report("divergent __syncthreads: thread %u at %s, another at %s", a.lin, (const char *)a.site,
                       (const char *)site);
        }
        if (!all) {
            std::string s;
            for (unsigned i = 0; i < n && s.size() < 2000; i++) {
                char buf[200];
                snprintf(buf, sizeof buf, " t%u:%s%s%s", i, state_name(threads[i]),
                         threads[i].st == BARRIER || threads[i].st == SHFL ? "@" : "",
                         threads[i].st == BARRIER || threads[i].st == SHFL ? (const char *)threads[i].site : "");
                s += buf;
            }
            report("deadlock: no thread can go on:%s", s.c_str());
            for (unsigned i = 0; i < n; i++)
                if (threads[i].st != DONE) threads[i].st = READY;
            continue;
        }
        if (n_done > 0) barrier_after_exit++;  // legal since Volta (exited threads do not count), noted
        for (unsigned i = 0; i < n; i++)
            if (threads[i].st == BARRIER) threads[i].st = READY;
    }
}

struct KernelStats {
    long long launches = 0, blocks = 0, threads = 0;
    size_t max_smem = 0;
    unsigned max_block = 0;
};
static std::map<std::string, KernelStats> stats;
static bool stats_registered;
static void print_stats() {
    if (!env_int("CUDAEMU_STATS", 0)) return;
    fprintf(stderr, "cudaemu: %-40s %9s %11s %13s %9s %6s\n", "kernel", "launches", "blocks", "threads", "max smem",
            "block");
    for (auto &kv : stats)
        fprintf(stderr, "cudaemu: %-40s %9lld %11lld %13lld %9zu %6u\n", kv.first.c_str(), kv.second.launches,
                kv.second.blocks, kv.second.threads, kv.second.max_smem, kv.second.max_block);
    fprintf(stderr, "cudaemu: barriers reached after some threads had exited: %lld; problems: %d\n",
            barrier_after_exit, problems);
}

static void run_grid(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem,
                     const std::function<void()> &body) {
    unsigned n = block.x * block.y * block.z;
    if (threads.size() < n) {
        if (!stack_area) {
            stack_area = (unsigned char *)mmap(nullptr, STACK * 1024, PROT_READ | PROT_WRITE,
                                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (stack_area == MAP_FAILED) abort();
            threads.resize(1024);
            for (unsigned i = 0; i < 1024; i++) threads[i].stack = stack_area + STACK * i, threads[i].stack_size = STACK;
        }
    }
    for (unsigned i = 0; i < n; i++) {
        threads[i].lin = i;
        threads[i].tid = uint3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
    }
    std::vector<unsigned char> smem_buf(smem + 1);
    Block b;
    b.dim = block;
    b.grid = grid;
    b.dyn_smem = smem ? smem_buf.data() : nullptr;
    uint64_t nb = (uint64_t)grid.x * grid.y * grid.z;
    std::vector<uint64_t> border;
    int bmode = order_mode("CUDAEMU_BLOCKS");
    if (bmode) {
        border.resize(nb);
        for (uint64_t i = 0; i < nb; i++) border[i] = i;
        if (bmode == 1) std::reverse(border.begin(), border.end());
        else std::shuffle(border.begin(), border.end(), rng());
    }
    const char *pk = cur_kernel, *pf = cur_file;
    int pl = cur_line;
    cur_kernel = name, cur_file = file, cur_line = line;
    cur_body = &body;
    for (uint64_t k = 0; k < nb; k++) {
        uint64_t i = bmode ? border[k] : k;
        b.idx = uint3{(unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y), (unsigned)(i / ((uint64_t)grid.x * grid.y))};
        if (smem) memset(b.dyn_smem, 0xff, smem);  // uninitialised shared memory reads as NaN / -1
        cur_block = &b;
        run_block(n);
        cur_block = nullptr;
    }
    cur_kernel = pk, cur_file = pf, cur_line = pl;
    KernelStats &s = stats[name];
    s.launches++, s.blocks += (long long)nb, s.threads += (long long)(nb * n);
    s.max_smem = std::max(s.max_smem, smem), s.max_block = std::max(s.max_block, n);
    if (!stats_registered) stats_registered = true, atexit(print_stats);
}

}  // namespace cudaemu

// ---- one lock over the whole runtime ----
// The emulator's state (streams, allocations, the fibers' stacks) is shared by the process; a
// program may call the runtime from several threads (a reader thread queuing copies, two sessions
// in two threads). Every entry point holds this lock, so calls are serialized, as if one GPU
// front end took them in turn; queued work runs inside whichever call drains it.
//
// A thread inside the runtime may have to wait for another: an NCCL all-reduce running on one
// device's stream needs the other ranks' calls, which their own host threads make. It waits with
// wait_released, which gives the lock up entirely (whatever its depth) until another thread calls
// wake, and takes it back at the same depth.
struct runtime_mutex {
    std::mutex m;
    std::condition_variable cv;
    std::thread::id owner;
    int depth = 0;
    uint64_t gen = 0;  // wake calls
    void lock() {
        std::unique_lock<std::mutex> l(m);
        const std::thread::id me = std::this_thread::get_id();
        if (depth > 0 && owner == me) {
            depth++;
            return;
        }
        cv.wait(l, [&]() { return depth == 0; });
        owner = me;
        depth = 1;
    }
    void unlock() {
        std::unique_lock<std::mutex> l(m);
        if (--depth == 0) {
            owner = std::thread::id();
            cv.notify_all();
        }
    }
    // Held by the caller: released until the next wake by another thread, then held again.
    void wait_released() {
        std::unique_lock<std::mutex> l(m);
        const int d = depth;
        const uint64_t g = gen;
        depth = 0;
        owner = std::thread::id();
        cv.notify_all();
        cv.wait(l, [&]() { return gen != g && depth == 0; });
        owner = std::this_thread::get_id();
        depth = d;
    }
    // Held by the caller: what threads in wait_released wait for may have changed.
    void wake() {
        std::unique_lock<std::mutex> l(m);
        gen++;
        cv.notify_all();
    }
};
static runtime_mutex &runtime_lock() {
    static runtime_mutex m;
    return m;
}
#define CUDAEMU_LOCK std::lock_guard<runtime_mutex> cudaemu_lock_(runtime_lock())

// ---- streams and events ----

struct cudaemu_event;
struct cudaemu_stream {
    std::deque<std::function<void()>> q;
    uint64_t enq = 0, done = 0;
    bool destroyed = false;
    // the host thread running the stream's front item, when that item waits for another thread
    // (an NCCL all-reduce for the other ranks): no other thread runs the items behind it meanwhile
    std::thread::id runner;
    // positions (0 = the first item ever queued) of the NCCL all-reduce calls still queued: a
    // device-wide drain leaves them to the stream's own waiters, since the thread draining may be
    // another rank's host thread whose own call the all-reduce would wait for
    std::set<uint64_t> nccl_at;
    int device = 0;  // the device current when it was created; the legacy stream: any
    // stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture): work is recorded, not queued
    int capture_mode = -1;  // a cudaStreamCaptureMode while capturing, else -1
    bool capture_bad = false;  // something unsupported happened: the capture is invalidated
    std::vector<std::function<void()>> nodes;
};
// A captured graph and its executable form: the recorded work, in order (one stream's capture is a
// chain), with the arguments it was recorded with.
struct cudaemu_graph {
    std::vector<std::function<void()>> nodes;
    int device = 0;
};
struct cudaemu_graph_exec {
    std::vector<std::function<void()>> nodes;
    int device = 0;
};
struct cudaemu_event {
    cudaemu_stream *s = nullptr;
    uint64_t target = 0;
    int device = 0;
};
// The current device is per host thread, as in CUDA (each thread starts on device 0).
static thread_local int current_device;

static thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

static bool async_mode() {
    static int a = cudaemu::env_int("CUDAEMU_ASYNC", 1);
    return a != 0;
}
static std::vector<cudaemu_stream *> &all_streams() {
    static std::vector<cudaemu_stream *> v;
    return v;
}
static cudaemu_stream *legacy() {
    static cudaemu_stream s;
    return &s;
}
static cudaemu_stream *S(cudaStream_t s) { return s ? (cudaemu_stream *)s : legacy(); }

// Runs s's queued work up to position upto. A stream another thread is running (its front item
// waits for a third: an all-reduce) is waited for (wait), or left to that thread (a device-wide
// synchronize: the stream is another device's, which CUDA would not wait for either).
static void drain(cudaemu_stream *s, uint64_t upto, bool wait = true) {
    const std::thread::id me = std::this_thread::get_id();
    while (s->done < upto && !s->q.empty()) {
        if (!wait && s->nccl_at.count(s->done)) return;
        if (s->runner != std::thread::id() && s->runner != me) {
            if (!wait) return;
            runtime_lock().wait_released();
            continue;
        }
        std::function<void()> f = std::move(s->q.front());
        s->q.pop_front();
        const std::thread::id prev = s->runner;
        s->runner = me;
        f();
        s->runner = prev;
        s->nccl_at.erase(s->done);
        s->done++;
        if (prev == std::thread::id()) runtime_lock().wake();
    }
}
static void drain_all() {
    drain(legacy(), legacy()->enq, false);
    for (cudaemu_stream *s : all_streams()) drain(s, s->enq, false);
}
static void enqueue(cudaStream_t st, std::function<void()> f) {
    cudaemu_stream *s = S(st);
    if (s->capture_mode >= 0) {  // recorded for the graph: runs only when it is launched
        s->nodes.push_back(std::move(f));
        return;
    }
    if (!st) drain_all();  // the legacy stream waits for the others
    s->q.push_back(std::move(f));
    s->enq++;
    if (!async_mode() || !st) drain(s, s->enq);
}

// ---- memory bookkeeping ----

struct Range {
    size_t bytes;
    int kind;  // 0 device, 1 pinned (cudaHostAlloc), 2 registered
    int device;  // device memory: the device current at cudaMalloc
};
static std::map<uintptr_t, Range> ranges;

static const Range *find_range(const void *p, uintptr_t *base) {
    auto it = ranges.upper_bound((uintptr_t)p);
    if (it == ranges.begin()) return nullptr;
    --it;
    if ((uintptr_t)p >= it->first + it->second.bytes && !((uintptr_t)p == it->first && it->second.bytes == 0))
        return nullptr;
    if (base) *base = it->first;
    return &it->second;
}
static bool is_pinned(const void *p) {
    const Range *r = find_range(p, nullptr);
    return r && r->kind != 0;
}
// Device memory of one device used by work on another device's stream (on_device >= 0): our
// backend keeps every device's memory and streams apart, so this is reported (CUDA itself would
// copy through unified addressing, or fault in a kernel without peer access).
static void check_span_on(const char *what, const void *p, size_t bytes, bool device, int on_device) {
    if (!bytes) return;
    uintptr_t base;
    const Range *r = find_range(p, &base);
    if (!r) {
        if (device) cudaemu::report("%s: %p (%zu bytes) is not in any device allocation", what, p, bytes);
        return;
    }
    if (device && r->kind == 0 && on_device >= 0 && r->device != on_device)
        cudaemu::report("%s: %p is memory of device %d, used on a stream of device %d", what, p, r->device, on_device);
    if (device && r->kind == 2) return;  // registered host memory: device-visible in this model
    if ((uintptr_t)p + bytes > base + r->bytes)
        cudaemu::report("%s: %zu bytes at %p run %zu bytes past the end of the allocation of %zu bytes at %p", what,
                        bytes, p, (size_t)((uintptr_t)p + bytes - base - r->bytes), r->bytes, (void *)base);
}
static void check_span(const char *what, const void *p, size_t bytes, bool device) {
    check_span_on(what, p, bytes, device, -1);
}
// The device a stream's work runs on (-1: the legacy stream, which serves the current device).
static int stream_device(cudaStream_t s) { return s ? ((cudaemu_stream *)s)->device : -1; }

// Capture rules. On a capturing stream, work that a replay could not repeat (a copy from or to
// pageable memory, whose data CUDA stages at the call) and a synchronization are errors that
// invalidate the capture, as in CUDA; so are events on it (CUDA allows them as dependencies
// between streams; not emulated: reported instead). In the global mode, memory allocation and
// synchronous calls by any thread while a capture runs are errors too; the relaxed mode allows them.
static bool capturing(cudaStream_t s) { return s && ((cudaemu_stream *)s)->capture_mode >= 0; }
static cudaError_t capture_refuse(cudaStream_t s, const char *what) {
    cudaemu_stream *st = (cudaemu_stream *)s;
    st->capture_bad = true;
    cudaemu::report("%s on a stream that is being captured: invalidates the capture", what);
    return cudaErrorStreamCaptureUnsupported;
}
static bool global_capture_active() {
    for (cudaemu_stream *s : all_streams())
        if (s->capture_mode == cudaStreamCaptureModeGlobal) return true;
    return false;
}
static cudaError_t global_capture_refuse(const char *what) {
    for (cudaemu_stream *s : all_streams())
        if (s->capture_mode == cudaStreamCaptureModeGlobal) s->capture_bad = true;
    cudaemu::report("%s while a stream is captured in the global mode: invalidates the capture", what);
    return cudaErrorStreamCaptureUnsupported;
}

static const size_t TOTAL_MEM = (size_t)80 << 30;

cudaError_t cudaDriverGetVersion(int *v) {
    CUDAEMU_LOCK;
    *v = cudaemu::env_int("CUDAEMU_DRIVER", CUDART_VERSION);
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    CUDAEMU_LOCK;
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n) {
    CUDAEMU_LOCK;
    *n = 0;
    if (cudaemu::env_int("CUDAEMU_DRIVER", CUDART_VERSION) < CUDART_VERSION) return fail(cudaErrorInsufficientDriver);
    *n = cudaemu::env_int("CUDAEMU_DEVICES", 1);
    return *n > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
static bool valid_device(int d) { return d >= 0 && d < 64 && d < cudaemu::env_int("CUDAEMU_DEVICES", 1); }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    CUDAEMU_LOCK;
    if (!valid_device(d)) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cudaemu %d (CPU emulation)", d);
    p->totalGlobalMem = TOTAL_MEM;
    p->sharedMemPerBlock = 48 * 1024;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = cudaemu::env_int("CUDAEMU_SM_COUNT", 132);
    p->pciBusID = d + 1;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
    CUDAEMU_LOCK;
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) return fail(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMemoryPoolsSupported: *v = cudaemu::env_int("CUDAEMU_MEMPOOLS", 1) != 0; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *out, int len, int d) {
    CUDAEMU_LOCK;
    if (!valid_device(d)) return fail(cudaErrorInvalidDevice);
    if (len < 13) return fail(cudaErrorInvalidValue);
    snprintf(out, (size_t)len, "0000:%02x:00.0", d + 1);
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    CUDAEMU_LOCK;
    *d = current_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    CUDAEMU_LOCK;
    if (!valid_device(d)) return fail(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
static size_t allocated[64];  // per device
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    CUDAEMU_LOCK;
    *t = TOTAL_MEM;
    *f = TOTAL_MEM - allocated[current_device];
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    CUDAEMU_LOCK;
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }
const char *cudaGetErrorName(cudaError_t e) {
    CUDAEMU_LOCK;
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorNoKernelImageForDevice: return "cudaErrorNoKernelImageForDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorPeerAccessUnsupported: return "cudaErrorPeerAccessUnsupported";
    case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    default: return "cudaErrorUnknown";
    }
}
const char *cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaMalloc(void **p, size_t bytes) {
    CUDAEMU_LOCK;
    *p = nullptr;
    if (global_capture_active()) return fail(global_capture_refuse("cudaMalloc"));
    if (bytes > TOTAL_MEM - allocated[current_device]) return fail(cudaErrorMemoryAllocation);
    void *m = nullptr;
    if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, bytes);  // fresh device memory is not zeroed: uninitialised f32 reads as NaN
    ranges[(uintptr_t)m] = Range{bytes, 0, current_device};
    allocated[current_device] += bytes;
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    CUDAEMU_LOCK;
    if (global_capture_active()) return fail(global_capture_refuse("cudaFree"));
    drain_all();  // cudaFree synchronizes
    if (!p) return cudaSuccess;
    auto it = ranges.find((uintptr_t)p);
    if (it == ranges.end() || it->second.kind != 0) return fail(cudaErrorInvalidValue);
    allocated[it->second.device] -= it->second.bytes;
    ranges.erase(it);
    free(p);
    return cudaSuccess;
}
// Stream-ordered allocation: the memory is there at once (as the pool's would be for the work
// queued after the call); the free runs when the stream reaches it, so work queued before it may
// still use the memory, and nothing waits for any other stream (no drain). Not in a capture.
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
    CUDAEMU_LOCK;
    *p = nullptr;
    if (capturing(s)) return fail(capture_refuse(s, "cudaMallocAsync"));
    if (bytes > TOTAL_MEM - allocated[current_device]) return fail(cudaErrorMemoryAllocation);
    void *m = nullptr;
    if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, bytes);
    ranges[(uintptr_t)m] = Range{bytes, 0, current_device};
    allocated[current_device] += bytes;
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    CUDAEMU_LOCK;
    if (capturing(s)) return fail(capture_refuse(s, "cudaFreeAsync"));
    if (!p) return cudaSuccess;
    auto it = ranges.find((uintptr_t)p);
    if (it == ranges.end() || it->second.kind != 0) return fail(cudaErrorInvalidValue);
    enqueue(s, [p]() {
        auto r = ranges.find((uintptr_t)p);
        if (r == ranges.end()) {
            cudaemu::report("cudaFreeAsync: %p was freed before the stream reached its free", p);
            return;
        }
        allocated[r->second.device] -= r->second.bytes;
        ranges.erase(r);
        free(p);
    });
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    CUDAEMU_LOCK;
    (void)flags;
    void *m = nullptr;
    if (posix_memalign(&m, 4096, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
    ranges[(uintptr_t)m] = Range{bytes, 1, -1};
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void *p) {
    CUDAEMU_LOCK;
    drain_all();
    if (!p) return cudaSuccess;
    auto it = ranges.find((uintptr_t)p);
    if (it == ranges.end() || it->second.kind != 1) return fail(cudaErrorInvalidValue);
    ranges.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags) {
    CUDAEMU_LOCK;
    (void)flags;
    if (!is_pinned(host)) return fail(cudaErrorInvalidValue);
    *dev = host;
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int flags) {
    CUDAEMU_LOCK;
    (void)flags;
    if (!p || !bytes) return fail(cudaErrorInvalidValue);
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    for (auto &kv : ranges)
        if (kv.second.kind != 0 && kv.first < hi && lo < kv.first + kv.second.bytes)
            return fail(cudaErrorHostMemoryAlreadyRegistered);
    ranges[lo] = Range{bytes, 2, -1};
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    CUDAEMU_LOCK;
    drain_all();
    auto it = ranges.find((uintptr_t)p);
    if (it == ranges.end() || it->second.kind != 2) return fail(cudaErrorHostMemoryNotRegistered);
    ranges.erase(it);
    return cudaSuccess;
}

// ---- one copy engine (CUDAEMU_COPY_ENGINES=1) ----
//
// A GPU moves host <-> device copies through its copy engines, each a FIFO whatever the stream: a
// small copy queued on one stream waits for a large one queued earlier on another stream. With
// CUDAEMU_COPY_ENGINES=1 every such copy takes a ticket in one FIFO, and when a copy's turn comes
// on its stream, the copies with earlier tickets run first (with the work queued before them on
// their streams). Unset or 0: copies wait only for their own stream, as before.
struct copy_ticket {
    cudaemu_stream *s;
    uint64_t pos;  // the stream's queue position that completes the copy
    bool done;
};
static std::vector<copy_ticket> copy_fifo;
static size_t copy_fifo_open;  // tickets before it are done

static void copy_fifo_wait(size_t t) {
    for (size_t u = copy_fifo_open; u < t; u++)
        if (!copy_fifo[u].done) drain(copy_fifo[u].s, copy_fifo[u].pos);
    while (copy_fifo_open < copy_fifo.size() && copy_fifo[copy_fifo_open].done) copy_fifo_open++;
}
static void enqueue_copy(cudaStream_t st, std::function<void()> f) {
    if (capturing(st) || cudaemu::env_int("CUDAEMU_COPY_ENGINES", 0) != 1) {
        enqueue(st, std::move(f));
        return;
    }
    size_t t = copy_fifo.size();
    copy_fifo.push_back(copy_ticket{S(st), 0, false});
    copy_fifo[t].pos = S(st)->enq + 1;  // set before enqueue, which may run it at once
    enqueue(st, [t, f]() {
        copy_fifo_wait(t);
        f();
        copy_fifo[t].done = true;
    });
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k, cudaStream_t s) {
    CUDAEMU_LOCK;
    if (!bytes) return cudaSuccess;
    switch (k) {
    case cudaMemcpyHostToDevice:
        if (capturing(s) && !is_pinned(src)) return fail(capture_refuse(s, "cudaMemcpyAsync from pageable memory"));
        check_span_on("cudaMemcpyAsync HostToDevice destination", dst, bytes, true, stream_device(s));
        if (find_range(src, nullptr) && !is_pinned(src))
            cudaemu::report("cudaMemcpyAsync HostToDevice: the source %p is device memory", src);
        if (is_pinned(src)) {  // a DMA from the host buffer when the stream gets there
            check_span("cudaMemcpyAsync HostToDevice pinned source", src, bytes, false);
            enqueue_copy(s, [=]() { memcpy(dst, src, bytes); });
        } else {  // pageable: staged at once
            std::shared_ptr<std::vector<unsigned char>> snap(
                new std::vector<unsigned char>((const unsigned char *)src, (const unsigned char *)src + bytes));
            enqueue_copy(s, [=]() { memcpy(dst, snap->data(), bytes); });
        }
        return cudaSuccess;
    case cudaMemcpyDeviceToHost:
        if (capturing(s) && !is_pinned(dst)) return fail(capture_refuse(s, "cudaMemcpyAsync to pageable memory"));
        check_span_on("cudaMemcpyAsync DeviceToHost source", src, bytes, true, stream_device(s));
        if (find_range(dst, nullptr) && !is_pinned(dst))
            cudaemu::report("cudaMemcpyAsync DeviceToHost: the destination %p is device memory", dst);
        if (is_pinned(dst)) {
            check_span("cudaMemcpyAsync DeviceToHost pinned destination", dst, bytes, false);
            enqueue_copy(s, [=]() { memcpy(dst, src, bytes); });
        } else {  // pageable: returns once the copy is done
            enqueue_copy(s, [=]() { memcpy(dst, src, bytes); });
            cudaemu_stream *st = S(s);
            drain(st, st->enq);
        }
        return cudaSuccess;
    case cudaMemcpyDeviceToDevice:
        check_span_on("cudaMemcpyAsync DeviceToDevice source", src, bytes, true, stream_device(s));
        check_span_on("cudaMemcpyAsync DeviceToDevice destination", dst, bytes, true, stream_device(s));
        enqueue(s, [=]() { memmove(dst, src, bytes); });
        return cudaSuccess;
    default: enqueue(s, [=]() { memmove(dst, src, bytes); }); return cudaSuccess;
    }
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k) {
    CUDAEMU_LOCK;
    if (global_capture_active()) return fail(global_capture_refuse("cudaMemcpy"));
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, k, 0);
    drain_all();
    return e;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s) {
    CUDAEMU_LOCK;
    check_span("cudaMemsetAsync", dst, bytes, true);
    enqueue(s, [=]() { memset(dst, v, bytes); });
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    CUDAEMU_LOCK;
    for (cudaemu_stream *s : all_streams())
        if (s->capture_mode >= 0) return fail(capture_refuse((cudaStream_t)s, "cudaDeviceSynchronize"));
    drain_all();
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    CUDAEMU_LOCK;
    (void)flags;
    cudaemu_stream *st = new cudaemu_stream;
    st->device = current_device;
    all_streams().push_back(st);
    *s = (cudaStream_t)st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    CUDAEMU_LOCK;
    if (!s) return fail(cudaErrorInvalidResourceHandle);
    cudaemu_stream *st = S(s);
    if (st->capture_mode >= 0) return fail(capture_refuse(s, "cudaStreamDestroy"));
    drain(st, st->enq);  // work still queued completes
    auto &v = all_streams();
    v.erase(std::remove(v.begin(), v.end(), st), v.end());
    delete st;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    CUDAEMU_LOCK;
    if (capturing(s)) return fail(capture_refuse(s, "cudaStreamSynchronize"));
    cudaemu_stream *st = S(s);
    if (!s) drain_all();
    drain(st, st->enq);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    CUDAEMU_LOCK;
    (void)flags;
    cudaemu_event *ev = new cudaemu_event;
    ev->device = current_device;
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    CUDAEMU_LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    delete (cudaemu_event *)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    CUDAEMU_LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    cudaemu_event *ev = (cudaemu_event *)e;
    if (s && ((cudaemu_stream *)s)->device != ev->device)  // CUDA: event and stream of one device
        return fail(cudaErrorInvalidResourceHandle);
    if (capturing(s)) return fail(capture_refuse(s, "cudaEventRecord (not emulated)"));
    ev->s = S(s);
    ev->target = ev->s->enq;
    if (!async_mode()) drain(ev->s, ev->target);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    CUDAEMU_LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    cudaemu_event *ev = (cudaemu_event *)e;
    if (ev->s) drain(ev->s, ev->target);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    CUDAEMU_LOCK;
    cudaemu_event *ev = (cudaemu_event *)e;
    return !ev->s || ev->s->done >= ev->target ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    CUDAEMU_LOCK;
    (void)flags;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    if (capturing(s)) return fail(capture_refuse(s, "cudaStreamWaitEvent (not emulated)"));
    cudaemu_event *ev = (cudaemu_event *)e;
    cudaemu_stream *src = ev->s;
    uint64_t target = ev->target;  // the record in force now
    if (!src) return cudaSuccess;
    enqueue(s, [src, target]() { drain(src, target); });
    return cudaSuccess;
}

// ---- graphs: stream capture and replay ----

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    CUDAEMU_LOCK;
    if (!s) return fail(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot be captured
    cudaemu_stream *st = (cudaemu_stream *)s;
    if (st->capture_mode >= 0 || mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue);
    st->capture_mode = mode;
    st->capture_bad = false;
    st->nodes.clear();
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    CUDAEMU_LOCK;
    *graph = nullptr;
    if (!capturing(s)) return fail(cudaErrorStreamCaptureUnmatched);
    cudaemu_stream *st = (cudaemu_stream *)s;
    st->capture_mode = -1;
    std::vector<std::function<void()>> nodes;
    nodes.swap(st->nodes);
    if (st->capture_bad) return fail(cudaErrorStreamCaptureInvalidated);
    cudaemu_graph *g = new cudaemu_graph;
    g->nodes = std::move(nodes);
    g->device = st->device;
    *graph = g;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
    CUDAEMU_LOCK;
    cudaemu_stream *st = S(s);
    *status = st->capture_mode < 0 ? cudaStreamCaptureStatusNone
              : st->capture_bad    ? cudaStreamCaptureStatusInvalidated
                                   : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    CUDAEMU_LOCK;
    *exec = nullptr;
    if (!graph || flags) return fail(cudaErrorInvalidValue);
    cudaemu_graph_exec *x = new cudaemu_graph_exec;
    x->nodes = graph->nodes;
    x->device = graph->device;
    *exec = x;
    return cudaSuccess;
}
static long long graph_launches;
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    CUDAEMU_LOCK;
    if (!exec) return fail(cudaErrorInvalidResourceHandle);
    if (capturing(s)) return fail(capture_refuse(s, "cudaGraphLaunch (not emulated)"));
    if (s && ((cudaemu_stream *)s)->device != exec->device) return fail(cudaErrorInvalidResourceHandle);
    for (const std::function<void()> &f : exec->nodes) enqueue(s, f);
    if (++graph_launches == 1 && cudaemu::env_int("CUDAEMU_STATS", 0))
        atexit([]() { fprintf(stderr, "cudaemu: %lld graph launches\n", graph_launches); });
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    CUDAEMU_LOCK;
    if (!exec) return fail(cudaErrorInvalidResourceHandle);
    drain_all();  // launches still queued hold copies of its nodes; done before it goes, as in CUDA
    delete exec;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    CUDAEMU_LOCK;
    if (!graph) return fail(cudaErrorInvalidResourceHandle);
    delete graph;
    return cudaSuccess;
}

namespace cudaemu {
cudaError_t launch_body(const char *name, const char *file, int line, dim3 grid, dim3 block, size_t smem,
                        cudaStream_t s, std::function<void()> body) {
    CUDAEMU_LOCK;
    uint64_t nt = (uint64_t)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z || !nt || nt > 1024 || block.z > 64 || grid.x > 0x7fffffffu ||
        grid.y > 65535 || grid.z > 65535)
        return fail(cudaErrorInvalidConfiguration);
    if (smem > 48 * 1024) return fail(cudaErrorInvalidValue);  // more needs cudaFuncSetAttribute
    // a GPU that none of the module's SASS or PTX targets fits (CUDAEMU_NO_KERNEL_IMAGE=1)
    if (env_int("CUDAEMU_NO_KERNEL_IMAGE", 0)) return fail(cudaErrorNoKernelImageForDevice);
    if (s && ((cudaemu_stream *)s)->device != current_device)  // CUDA: a stream of the current device
        return fail(cudaErrorInvalidResourceHandle);
    std::string nm = name;
    std::string f = file;
    enqueue(s, [=]() { run_grid(nm.c_str(), f.c_str(), line, grid, block, smem, body); });
    return cudaSuccess;
}
}  // namespace cudaemu

// ---- several devices: peer access (CUDAEMU_P2P=1: every pair can; 0, the default: none, like
// consumer cards such as the RTX 4090) ----

static bool peer_enabled[64][64];  // [device][peer]: device's work may reach peer's memory
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
    CUDAEMU_LOCK;
    if (!valid_device(device) || !valid_device(peer)) return fail(cudaErrorInvalidDevice);
    *can = device != peer && cudaemu::env_int("CUDAEMU_P2P", 0) != 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
    CUDAEMU_LOCK;
    if (flags || !valid_device(peer)) return fail(cudaErrorInvalidValue);
    if (peer == current_device || cudaemu::env_int("CUDAEMU_P2P", 0) == 0) return fail(cudaErrorPeerAccessUnsupported);
    if (peer_enabled[current_device][peer]) return fail(cudaErrorPeerAccessAlreadyEnabled);
    peer_enabled[current_device][peer] = true;
    return cudaSuccess;
}
// A copy between two devices' memory; without peer access CUDA stages it through the host, which
// is what this does too (a memcpy when the stream gets there).
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                                cudaStream_t s) {
    CUDAEMU_LOCK;
    if (!valid_device(dst_device) || !valid_device(src_device)) return fail(cudaErrorInvalidDevice);
    if (!bytes) return cudaSuccess;
    check_span_on("cudaMemcpyPeerAsync source", src, bytes, true, src_device);
    check_span_on("cudaMemcpyPeerAsync destination", dst, bytes, true, dst_device);
    enqueue(s, [=]() { memcpy(dst, src, bytes); });
    return cudaSuccess;
}
cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t bytes) {
    CUDAEMU_LOCK;
    cudaError_t e = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, 0);
    drain_all();
    return e;
}

// ---- NCCL: the communicators and the all-reduce our module uses (include/nccl.h) ----
//
// Communicators made together (ncclCommInitAll) form a clique. An all-reduce is queued on the
// caller's stream like a kernel; when its stream reaches it, that rank arrives at the call's
// meeting (the clique's calls are numbered in each rank's stream order) and waits for every other
// rank to arrive at the same call: it runs their streams up to their call where it can (their work
// before the call is what the sum needs, as a GPU would run it meanwhile), and otherwise, when a
// rank's host thread has not queued the call yet, gives the runtime lock up until something
// changes. The last rank to arrive adds the ranks' buffers in rank order (x_0 + x_1) + x_2 ...
// and writes the sum into every rank's buffer. Peer access plays no part (NCCL goes through host
// memory without it).

struct nccl_meeting {
    int arrived = 0, left = 0;
    bool done = false;
    size_t count = 0;
    std::vector<const float *> send;
    std::vector<float *> recv;
    std::vector<bool> here;
};
struct nccl_clique {
    int n = 0, alive = 0;
    std::vector<ncclComm_t> comms;
    std::map<uint64_t, nccl_meeting> meetings;  // by call number
};
struct ncclComm {
    nccl_clique *clique;
    int rank, device;
    uint64_t arrivals = 0;             // calls this rank's stream has reached
    cudaemu_stream *stream = nullptr;  // of its latest call: where the others drive it
};

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = 22800;  // plays NCCL 2.28
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (cudaemu)";
    case ncclSystemError: return "unhandled system error (cudaemu)";
    case ncclInternalError: return "internal error (cudaemu)";
    case ncclInvalidArgument: return "invalid argument (cudaemu)";
    case ncclInvalidUsage: return "invalid usage (cudaemu)";
    default: return "unknown result code (cudaemu)";
    }
}
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devlist) {
    CUDAEMU_LOCK;
    if (!comms || n < 1 || n > 64) return ncclInvalidArgument;
    for (int i = 0; i < n; i++) {
        int d = devlist ? devlist[i] : i;
        if (!valid_device(d)) return ncclInvalidArgument;
        for (int j = 0; j < i; j++)
            if ((devlist ? devlist[j] : j) == d) return ncclInvalidUsage;  // one rank per device
    }
    nccl_clique *c = new nccl_clique;
    c->n = c->alive = n;
    for (int i = 0; i < n; i++) {
        comms[i] = new ncclComm{c, i, devlist ? devlist[i] : i};
        c->comms.push_back(comms[i]);
    }
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    CUDAEMU_LOCK;
    if (!comm) return ncclInvalidArgument;
    nccl_clique *c = comm->clique;
    c->comms[comm->rank] = nullptr;
    delete comm;
    if (--c->alive == 0) delete c;
    return ncclSuccess;
}

// Rank comm->rank's stream reached its next call.
static void nccl_arrive(ncclComm_t comm, const float *send, float *recv, size_t count) {
    nccl_clique *c = comm->clique;
    const uint64_t call = comm->arrivals++;
    nccl_meeting &m = c->meetings[call];
    if (m.here.empty()) m.send.resize(c->n), m.recv.resize(c->n), m.here.resize(c->n), m.count = count;
    if (count != m.count)
        cudaemu::report("ncclAllReduce: call %llu has %zu elements on rank %d, %zu on another rank",
                        (unsigned long long)call, count, comm->rank, m.count);
    m.send[comm->rank] = send, m.recv[comm->rank] = recv, m.here[comm->rank] = true;
    if (++m.arrived == c->n) {
        std::vector<float> sum(m.send[0], m.send[0] + m.count);
        for (int r = 1; r < c->n; r++)
            for (size_t i = 0; i < m.count; i++) sum[i] += m.send[r][i];
        for (int r = 0; r < c->n; r++) memcpy(m.recv[r], sum.data(), m.count * sizeof(float));
        m.done = true;
        runtime_lock().wake();
    }
    const std::thread::id me = std::this_thread::get_id();
    while (!m.done) {
        bool ran = false;
        for (int r = 0; r < c->n && !ran; r++) {
            cudaemu_stream *s = c->comms[r] ? c->comms[r]->stream : nullptr;
            if (m.here[r] || !s || s->q.empty() || (s->runner != std::thread::id() && s->runner != me)) continue;
            drain(s, s->done + 1);  // one item of rank r's stream, its call at the latest
            ran = true;
        }
        if (!ran) runtime_lock().wait_released();  // a rank's host thread has yet to queue its call
    }
    if (++m.left == c->n) c->meetings.erase(call);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    CUDAEMU_LOCK;
    if (!comm || !comm->clique->comms[comm->rank]) return ncclInvalidArgument;
    if (type != ncclFloat32 || op != ncclSum) {
        cudaemu::report("ncclAllReduce: only the f32 sum is emulated (type %d, op %d)", (int)type, (int)op);
        return ncclInvalidArgument;
    }
    if (!stream || ((cudaemu_stream *)stream)->device != comm->device) {
        cudaemu::report("ncclAllReduce: rank %d of device %d called on a stream of device %d", comm->rank, comm->device,
                        stream ? ((cudaemu_stream *)stream)->device : -1);
        return ncclInvalidArgument;
    }
    check_span_on("ncclAllReduce send buffer", send, count * sizeof(float), true, comm->device);
    check_span_on("ncclAllReduce receive buffer", recv, count * sizeof(float), true, comm->device);
    comm->stream = (cudaemu_stream *)stream;
    const float *x = (const float *)send;
    float *y = (float *)recv;
    cudaemu_stream *es = S(stream);
    if (es->capture_mode < 0) es->nccl_at.insert(es->enq);
    enqueue(stream, [comm, x, y, count]() { nccl_arrive(comm, x, y, count); });
    runtime_lock().wake();  // a rank waiting for this one may run its stream now
    return ncclSuccess;
}

// ---- cuBLAS ----

struct cudaemu_cublas {
    cudaStream_t s = nullptr;
};
cublasStatus_t cublasCreate(cublasHandle_t *h) {
    CUDAEMU_LOCK;
    *h = new cudaemu_cublas;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    CUDAEMU_LOCK;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    CUDAEMU_LOCK;
    h->s = s;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    default: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
}
static float load_elem(const void *p, cudaDataType t, size_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: {
        uint16_t h = ((const uint16_t *)p)[i];
        uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
        if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);
        else if (exp == 0) {
            float v = (float)man * (1.0f / 16777216.0f);
            return sign ? -v : v;
        } else u = sign | ((exp + 112) << 23) | (man << 13);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    }
}
static size_t elem_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
// Column-major C (m, n) = alpha op(A) op(B) + beta C, f32 accumulation in k order.
static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           float alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                           int ldb, float beta, float *C, int ldc, const char *what) {
    if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
        ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!m || !n) return CUBLAS_STATUS_SUCCESS;
    size_t a_cols = ta == CUBLAS_OP_N ? k : m, a_rows = ta == CUBLAS_OP_N ? m : k;
    size_t b_cols = tb == CUBLAS_OP_N ? n : k, b_rows = tb == CUBLAS_OP_N ? k : n;
    if (k) {
        check_span(what, A, ((a_cols - 1) * (size_t)lda + a_rows) * elem_size(at), true);
        check_span(what, B, ((b_cols - 1) * (size_t)ldb + b_rows) * elem_size(bt), true);
    }
    check_span(what, C, ((size_t)(n - 1) * ldc + m) * 4, true);
    enqueue(h->s, [=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0;
                for (int l = 0; l < k; l++) {
                    float a = load_elem(A, at, ta == CUBLAS_OP_N ? i + (size_t)l * lda : l + (size_t)i * lda);
                    float b = load_elem(B, bt, tb == CUBLAS_OP_N ? l + (size_t)j * ldb : j + (size_t)l * ldb);
                    acc = fmaf(a, b, acc);
                }
                float &c = C[i + (size_t)j * ldc];
                c = beta == 0 ? alpha * acc : alpha * acc + beta * c;
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    CUDAEMU_LOCK;
    return gemm(h, ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, ldc, "cublasSgemm");
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    CUDAEMU_LOCK;
    (void)algo;
    if (ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F || at != bt) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm(h, ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta, (float *)C,
                ldc, "cublasGemmEx");
}
