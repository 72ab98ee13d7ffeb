/* The harness's stopwatch, out of reach of the candidate's Python.
 *
 * ks_begin / ks_end bracket one timed call. On the GPU they record CUDA events on the harness's
 * stream through the driver API (libcuda, loaded here), wait for the end event, measure how long
 * a device-wide sync then takes (work escaping the timed stream), and write one record per call
 * straight to a pipe whose other end only the evaluator holds. The measured values never become
 * Python objects in the candidate's process, so nothing a candidate reaches from Python (stack
 * frames, module globals, gc, patched functions, trace hooks) can change them. A candidate calling
 * these functions itself shows up as a broken begin/end sequence, reported in the record.
 * Native code in the candidate could still write here; that is what the evaluator's wall-clock,
 * physical-floor and re-timing checks are for.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KS_MAGIC 0x4b53544dU /* "KSTM" */
#define KS_OUT_OF_ORDER 1U

typedef int (*event_create_t)(void **, unsigned int);
typedef int (*event_record_t)(void *, void *);
typedef int (*event_sync_t)(void *);
typedef int (*event_elapsed_t)(float *, void *, void *);
typedef int (*ctx_sync_t)(void);
typedef int (*ctx_get_t)(void **);

struct record {
    uint32_t magic;
    uint32_t seq;
    double time_ms;
    double wall_ms;
    double tail_ms;
    double host_ms; /* from the start event's record to ks_end: the call's host time (its launch work) */
    uint32_t flags;
    uint32_t status; /* nonzero: a CUDA driver call failed (its CUresult) */
};

static int out_fd = -1;
static int use_cuda;
static int in_call;
static uint32_t seq;
static uint32_t flags;
static void *stream;
static void *ev_start, *ev_end;
static struct timespec wall_start;
static event_record_t event_record;
static event_sync_t event_sync;
static event_elapsed_t event_elapsed;
static ctx_sync_t ctx_sync;
static double sum, sumsq;
static int count;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* 0 on success; negative: the driver or a symbol was missing; positive: a CUresult. */
int ks_init(int fd, int cuda, uintptr_t stream_handle) {
    out_fd = fd;
    use_cuda = cuda;
    stream = (void *)stream_handle;
    if (!cuda)
        return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return -1;
    event_create_t event_create = (event_create_t)dlsym(lib, "cuEventCreate");
    ctx_get_t ctx_get = (ctx_get_t)dlsym(lib, "cuCtxGetCurrent");
    event_record = (event_record_t)dlsym(lib, "cuEventRecord");
    event_sync = (event_sync_t)dlsym(lib, "cuEventSynchronize");
    event_elapsed = (event_elapsed_t)dlsym(lib, "cuEventElapsedTime");
    ctx_sync = (ctx_sync_t)dlsym(lib, "cuCtxSynchronize");
    if (!event_create || !ctx_get || !event_record || !event_sync || !event_elapsed || !ctx_sync)
        return -2;
    void *ctx = 0;
    int rc = ctx_get(&ctx);
    if (rc || !ctx)
        return rc ? rc : -3;
    rc = event_create(&ev_start, 0);
    return rc ? rc : event_create(&ev_end, 0);
}

void ks_reset(void) {
    sum = sumsq = 0;
    count = 0;
}

int ks_begin(void) {
    if (in_call)
        flags |= KS_OUT_OF_ORDER;
    in_call = 1;
    clock_gettime(CLOCK_MONOTONIC, &wall_start);
    return use_cuda ? event_record(ev_start, stream) : 0;
}

int ks_end(void) {
    double returned = now_ms();
    struct record r;
    memset(&r, 0, sizeof r);
    if (!in_call)
        flags |= KS_OUT_OF_ORDER;
    in_call = 0;
    if (use_cuda) {
        int rc = event_record(ev_end, stream);
        if (!rc)
            rc = event_sync(ev_end);
        r.wall_ms = now_ms() - (wall_start.tv_sec * 1e3 + wall_start.tv_nsec / 1e6);
        /* The timed stream is done; a device-wide sync now returns at once unless work the
           events did not cover (side streams) is still running. */
        double t1 = now_ms();
        if (!rc)
            rc = ctx_sync();
        r.tail_ms = now_ms() - t1;
        float ms = 0;
        if (!rc)
            rc = event_elapsed(&ms, ev_start, ev_end);
        r.time_ms = ms;
        r.status = (uint32_t)rc;
    } else {
        r.wall_ms = now_ms() - (wall_start.tv_sec * 1e3 + wall_start.tv_nsec / 1e6);
        r.time_ms = r.wall_ms;
    }
    r.host_ms = returned - (wall_start.tv_sec * 1e3 + wall_start.tv_nsec / 1e6);
    r.magic = KS_MAGIC;
    r.seq = seq++;
    r.flags = flags;
    sum += r.time_ms;
    sumsq += r.time_ms * r.time_ms;
    count++;
    ssize_t n = write(out_fd, &r, sizeof r);
    return n == (ssize_t)sizeof r ? (int)r.status : -1;
}

/* GPUMode's stop rule on this workload's calls so far: 1 to stop. */
int ks_should_stop(int min_calls, double target_rel_err, double max_total_ms) {
    if (count < min_calls || count < 2)
        return 0;
    double mean = sum / count;
    double var = (sumsq - count * mean * mean) / (count - 1);
    double std = var > 0 ? sqrt(var) : 0;
    return mean <= 0 || std / sqrt((double)count) / mean < target_rel_err || count * mean > max_total_ms;
}
