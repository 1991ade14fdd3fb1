// spec-batch.c - speculative decoding over several sequences, their passes batched.
//
// Each generation of the batch is an ordinary tri_generate_spec call on its own engine, run on a
// thread of its own (its seat), so that its drafting, acceptance, rollbacks, sampler, refreshes
// and stop rules are exactly the engine's. Only one of them runs at a time: the seat holding the
// batch's turn. When a generation needs a forward pass of one of its levels (level.c's run), it
// posts the pass here and hands the turn back; once every running generation has posted one (or
// finished), a step runs the posted passes of the lowest level that has any (L1 before L2 before
// L3: a generation that waits at L3 lets the others catch up, so that L3's passes, the expensive
// ones, carry every sequence), together with every other posted pass over the same weights (L2
// and L3 of the target share them), in one tri__llama_forward_batch: the weights are read once per
// pass for all of them, each sequence attends over its own cache. On the CPU backend that pass is
// bit for bit each sequence's pass alone (llama.h), so each generation is the one it makes alone.
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "level.h"
#include "model.h"
#include "spec.h"

// Most rows of a batched pass, unless one sequence's step is longer (session.c's BATCH_ROWS).
#define BATCH_ROWS 1024
// Passes over distinct weights a step can hold apart (L1's draft, the target, a self-draft view).
#define MAX_RUNNERS 4

typedef enum seat_state {
    SEAT_READY = 0,  // may run: just added, or its pass ran
    SEAT_POSTED,     // waits for its pass
    SEAT_DONE,       // its generation returned
} seat_state;

typedef struct tri__batch_seat {
    struct tri_spec_batch *b;
    int32_t id;
    pthread_t thread;
    bool started, joined;
    // the generation (tri_generate_spec's arguments)
    tri_spec *spec;
    const int32_t *prompt;
    int32_t n_prompt;
    tri_generate_params params;
    tri_token_fn on_token;
    void *user;
    tri_spec_stats *stats;  // the caller's, or local
    tri_spec_stats local;
    seat_state state;
    tri_status status;  // of the generation, once done
    char error[512];    // its message, when it failed
    // the posted pass
    tri__level *lv;
    const int32_t *tokens;
    int32_t n;
    tri__logits_mode mode;
    float *dst;
    tri_status pass_status;
    char pass_error[512];
} tri__batch_seat;

// A batched pass's activations over one model's weights on one backend.
typedef struct runner {
    tri__llama ll;
    const tri__batch_seat *lead;  // whose level's model and backend ll was made over (a running seat)
    const tri__level *lv;         // that level (its engine's, alive while the seat runs)
} runner;

struct tri_spec_batch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t turn;  // the seat that may run, -1: none (the caller's step)
    tri__batch_seat **seats;
    int32_t n_seats, cap;
    runner runners[MAX_RUNNERS];
    int64_t n_passes;  // batched passes run (tri__spec_batch_passes)
    int64_t n_rows;    // pass requests they carried
};

// ---- the seats' side ----

// Waits (mu held) until the turn is the seat's.
static void wait_turn(tri__batch_seat *seat) {
    while (seat->b->turn != seat->id) pthread_cond_wait(&seat->b->cv, &seat->b->mu);
}

static void *seat_main(void *arg) {
    tri__batch_seat *seat = arg;
    tri_spec_batch *b = seat->b;
    pthread_mutex_lock(&b->mu);
    wait_turn(seat);
    pthread_mutex_unlock(&b->mu);
    tri_status st = tri_generate_spec(seat->spec, seat->prompt, seat->n_prompt, &seat->params, seat->on_token,
                                      seat->user, seat->stats);
    tri__spec_set_seat(seat->spec, NULL);
    pthread_mutex_lock(&b->mu);
    seat->status = st;
    if (st) snprintf(seat->error, sizeof seat->error, "%s", tri_last_error());
    seat->state = SEAT_DONE;
    b->turn = -1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

tri_status tri__batch_seat_run(tri__batch_seat *seat, tri__level *lv, const int32_t *tokens, int32_t n,
                               tri__logits_mode mode, float *dst) {
    tri_spec_batch *b = seat->b;
    pthread_mutex_lock(&b->mu);
    seat->lv = lv, seat->tokens = tokens, seat->n = n, seat->mode = mode, seat->dst = dst;
    seat->state = SEAT_POSTED;
    b->turn = -1;
    pthread_cond_broadcast(&b->cv);
    wait_turn(seat);  // the step ran the pass
    tri_status st = seat->pass_status;
    pthread_mutex_unlock(&b->mu);
    // the message the step recorded on its own thread, on this one (tri_last_error is per thread)
    if (st) return tri__fail(st, "%s", seat->pass_error);
    return TRI_STATUS_OK;
}

// ---- the caller's side ----

tri_status tri_spec_batch_create(tri_spec_batch **out) {
    if (!out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_spec_batch_create: out is NULL");
    *out = NULL;
    tri_spec_batch *b = calloc(1, sizeof *b);
    if (!b) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative batch");
    if (pthread_mutex_init(&b->mu, NULL)) {
        free(b);
        return tri__fail(TRI_STATUS_INTERNAL, "speculative batch: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&b->cv, NULL)) {
        pthread_mutex_destroy(&b->mu);
        free(b);
        return tri__fail(TRI_STATUS_INTERNAL, "speculative batch: pthread_cond_init failed");
    }
    b->turn = -1;
    *out = b;
    return TRI_STATUS_OK;
}

static bool seat_running(const tri__batch_seat *seat) { return seat->state != SEAT_DONE; }

tri_status tri_spec_batch_add(tri_spec_batch *b, tri_spec *spec, const int32_t *prompt, int32_t n_prompt,
                              const tri_generate_params *params, tri_token_fn on_token, void *user,
                              tri_spec_stats *stats, int32_t *out_id) {
    if (!b || !spec) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_spec_batch_add: batch or engine is NULL");
    for (int32_t i = 0; i < b->n_seats; i++)
        if (b->seats[i]->spec == spec && seat_running(b->seats[i]))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                             "speculative batch: the engine already generates in the batch (generation %d)", i);
    if (tri__spec_generating(spec))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "speculative batch: the engine generates elsewhere");
    if (b->n_seats == b->cap) {
        int32_t cap = b->cap ? 2 * b->cap : 8;
        tri__batch_seat **s = realloc(b->seats, (size_t)cap * sizeof *s);
        if (!s) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative batch: %d generations", cap);
        b->seats = s;
        b->cap = cap;
    }
    tri__batch_seat *seat = calloc(1, sizeof *seat);
    if (!seat) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative batch: a generation");
    seat->b = b;
    seat->id = b->n_seats;
    seat->spec = spec;
    seat->prompt = prompt;
    seat->n_prompt = n_prompt;
    seat->params = params ? *params : tri_generate_default_params();
    seat->on_token = on_token;
    seat->user = user;
    seat->stats = stats ? stats : &seat->local;
    seat->state = SEAT_READY;
    tri__spec_set_seat(spec, seat);  // (a level of several ranks runs alone)
    int rc = pthread_create(&seat->thread, NULL, seat_main, seat);
    if (rc) {
        tri__spec_set_seat(spec, NULL);
        free(seat);
        return tri__fail(TRI_STATUS_INTERNAL, "speculative batch: pthread_create failed (%s)", strerror(rc));
    }
    seat->started = true;
    b->seats[b->n_seats++] = seat;
    if (out_id) *out_id = seat->id;
    return TRI_STATUS_OK;
}

// Weights of a posted pass: its level's model (the same weights whatever engine's view of them).
static bool same_weights(const tri__level *a, const tri__level *b) {
    const tri_model *x = a->ll.model, *y = b->ll.model;
    const tri_model_config *cx = &x->config, *cy = &y->config;
    if (x == y) return a->ll.be->ops == b->ll.be->ops;
    return cx->n_layer == cy->n_layer && cx->n_embd == cy->n_embd && cx->n_head == cy->n_head &&
           cx->n_head_kv == cy->n_head_kv && cx->n_vocab == cy->n_vocab && cx->n_ff == cy->n_ff &&
           x->tok_embd->data == y->tok_embd->data && x->output->data == y->output->data &&
           x->layers[0].wq->data == y->layers[0].wq->data &&
           x->layers[cx->n_layer - 1].wq->data == y->layers[cy->n_layer - 1].wq->data && a->ll.be->ops == b->ll.be->ops;
}

// The level's place in its engine: 1 (L1), 2 (L2) or 3 (L3).
static int level_rank(const tri__batch_seat *seat) {
    tri__level *l1 = tri__spec_level(seat->spec, 1), *l2 = tri__spec_level(seat->spec, 2);
    return seat->lv == l1 ? 1 : seat->lv == l2 ? 2 : 3;
}

// A runner for the posted passes group[0 .. n) (same weights), with rows for a pass of them all.
static tri_status get_runner(tri_spec_batch *b, tri__batch_seat *const *group, int32_t n, tri__llama **out) {
    const tri__level *lv = group[0]->lv;
    int32_t rows = 0, most = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t nb = group[i]->lv->ll.n_batch;
        rows += group[i]->n < nb ? group[i]->n : nb;
        most = nb > most ? nb : most;
    }
    if (rows > BATCH_ROWS) rows = BATCH_ROWS;
    if (rows < most) rows = most;
    runner *free_slot = NULL;
    for (int k = 0; k < MAX_RUNNERS; k++) {
        runner *r = &b->runners[k];
        // a runner whose lead finished may have lost its model: dropped
        if (r->lead && !seat_running(r->lead)) {
            tri__llama_free(&r->ll);
            r->lead = NULL;
        }
        if (!r->lead) {
            if (!free_slot) free_slot = r;
            continue;
        }
        if (!same_weights(r->lv, lv) || r->lv->ll.be != lv->ll.be) continue;
        if (r->ll.n_batch >= rows) {
            *out = &r->ll;
            return TRI_STATUS_OK;
        }
        tri__llama_free(&r->ll);
        r->lead = NULL;
        free_slot = r;
        break;
    }
    if (!free_slot) {  // more kinds of weights than slots: the oldest goes
        free_slot = &b->runners[0];
        tri__llama_free(&free_slot->ll);
        free_slot->lead = NULL;
    }
    rows = (rows + 63) / 64 * 64;
    TRY(tri__llama_init(&free_slot->ll, lv->ll.model, lv->ll.be, rows));
    free_slot->lead = group[0];
    free_slot->lv = lv;
    *out = &free_slot->ll;
    return TRI_STATUS_OK;
}

// Runs the posted passes group[0 .. n) (same weights) in shared passes; sets each one's status.
static void run_group(tri_spec_batch *b, tri__batch_seat *const *group, int32_t n) {
    tri_status st = TRI_STATUS_OK;
    b->n_passes++;
    b->n_rows += n;
    if (n == 1) {  // alone: the level's own pass
        tri__batch_seat *s = group[0];
        st = tri__llama_forward_policy(&s->lv->ll, &s->lv->pol, s->tokens, s->n, s->mode, s->dst);
    } else {
        tri__llama *run = NULL;
        tri__llama_seq *seqs = calloc((size_t)n, sizeof *seqs);
        st = seqs ? get_runner(b, group, n, &run)
                  : tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative batch: %d sequences", n);
        for (int32_t i = 0; !st && i < n; i++) {
            tri__batch_seat *s = group[i];
            seqs[i] = (tri__llama_seq){&s->lv->ll, &s->lv->pol, s->tokens, s->n, s->mode, s->dst, 0};
        }
        if (!st) st = tri__llama_forward_batch(run, seqs, n);
        free(seqs);
    }
    for (int32_t i = 0; i < n; i++) {
        group[i]->stats->n_batch_passes++;
        group[i]->stats->n_batch_sequences += n;
        group[i]->pass_status = st;
        if (st) snprintf(group[i]->pass_error, sizeof group[i]->pass_error, "%s", tri_last_error());
    }
}

tri_status tri_spec_batch_step(tri_spec_batch *b, int32_t *n_running) {
    if (!b) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_spec_batch_step: batch is NULL");
    // every generation that may run does, one at a time, in the order they joined, until it posts
    // its next pass or returns
    for (int32_t i = 0; i < b->n_seats; i++) {
        tri__batch_seat *seat = b->seats[i];
        pthread_mutex_lock(&b->mu);
        if (seat->state == SEAT_READY) {
            b->turn = seat->id;
            pthread_cond_broadcast(&b->cv);
            while (b->turn == seat->id) pthread_cond_wait(&b->cv, &b->mu);
        }
        pthread_mutex_unlock(&b->mu);
        if (seat->state == SEAT_DONE && seat->started && !seat->joined) {
            pthread_join(seat->thread, NULL);
            seat->joined = true;
        }
    }
    // the posted passes of the lowest level posted, and every other one over the same weights
    int32_t n = b->n_seats, lowest = 4, running = 0;
    tri__batch_seat **group = malloc(sizeof *group * (size_t)(n > 0 ? n : 1));
    if (!group) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "speculative batch: %d generations", n);
    tri__batch_seat *first = NULL;
    for (int32_t i = 0; i < n; i++) {
        tri__batch_seat *seat = b->seats[i];
        if (seat->state != SEAT_POSTED) continue;
        int r = level_rank(seat);
        if (r < lowest) lowest = r, first = seat;
    }
    int32_t k = 0;
    for (int32_t i = 0; first && i < n; i++) {
        tri__batch_seat *seat = b->seats[i];
        if (seat->state == SEAT_POSTED && same_weights(seat->lv, first->lv)) group[k++] = seat;
    }
    if (k > 0) run_group(b, group, k);
    for (int32_t i = 0; i < k; i++) group[i]->state = SEAT_READY;  // they go on at the next step
    free(group);
    for (int32_t i = 0; i < n; i++) running += seat_running(b->seats[i]);
    if (n_running) *n_running = running;
    return TRI_STATUS_OK;
}

tri_status tri_spec_batch_result(const tri_spec_batch *b, int32_t id, bool *done, tri_status *status) {
    if (!b || id < 0 || id >= b->n_seats)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_spec_batch_result: no generation %d", id);
    const tri__batch_seat *seat = b->seats[id];
    bool fin = seat->state == SEAT_DONE && seat->joined;
    if (done) *done = fin;
    if (status) *status = fin ? seat->status : TRI_STATUS_OK;
    if (fin && seat->status) return tri__fail(seat->status, "%s", seat->error);
    return TRI_STATUS_OK;
}

void tri_spec_batch_free(tri_spec_batch *b) {
    if (!b) return;
    // generations still running stop at their next round (as tri_spec_abort), their passes run
    for (int32_t i = 0; i < b->n_seats; i++)
        if (seat_running(b->seats[i])) tri_spec_abort(b->seats[i]->spec);
    for (int32_t running = 1; running > 0;) {
        if (tri_spec_batch_step(b, &running)) break;  // (out of memory: the seats below are joined anyway)
        for (int32_t i = 0; i < b->n_seats; i++)      // one that had not started yet
            if (seat_running(b->seats[i])) tri_spec_abort(b->seats[i]->spec);
    }
    for (int32_t i = 0; i < b->n_seats; i++) {
        if (b->seats[i]->started && !b->seats[i]->joined) pthread_join(b->seats[i]->thread, NULL);
        free(b->seats[i]);
    }
    for (int k = 0; k < MAX_RUNNERS; k++)
        if (b->runners[k].lead) tri__llama_free(&b->runners[k].ll);
    free(b->seats);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

tri_status tri_generate_spec_batch(tri_spec *const *specs, const int32_t *const *prompts, const int32_t *n_prompts,
                                   const tri_generate_params *params, tri_token_fn on_token, void *const *users,
                                   tri_spec_stats *stats, tri_status *statuses, int32_t n) {
    if (!specs || !n_prompts || n < 1)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_generate_spec_batch: NULL argument or %d sequences", n);
    for (int32_t i = 0; i < n; i++) {
        if (!specs[i])
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_generate_spec_batch: sequence %d's engine is NULL", i);
        for (int32_t j = 0; j < i; j++)
            if (specs[i] == specs[j])
                return tri__fail(TRI_STATUS_INVALID_ARGUMENT,
                                 "tri_generate_spec_batch: sequences %d and %d have the same engine", j, i);
    }
    tri_spec_batch *b;
    TRY(tri_spec_batch_create(&b));
    tri_status st = TRI_STATUS_OK;
    for (int32_t i = 0; !st && i < n; i++)
        st = tri_spec_batch_add(b, specs[i], prompts ? prompts[i] : NULL, n_prompts[i], params ? &params[i] : NULL,
                                on_token, users ? users[i] : NULL, stats ? &stats[i] : NULL, NULL);
    for (int32_t running = 1; !st && running > 0;) st = tri_spec_batch_step(b, &running);
    // each sequence's own status; the first failure's is the call's
    tri_status first = st;
    char msg[512] = "";
    if (st) snprintf(msg, sizeof msg, "%s", tri_last_error());
    for (int32_t i = 0; i < n; i++) {
        tri_status si = TRI_STATUS_OK;
        bool done = false;
        if (i < b->n_seats && tri_spec_batch_result(b, i, &done, &si) && !first) {
            first = si;
            snprintf(msg, sizeof msg, "sequence %d: %s", i, tri_last_error());
        }
        if (statuses) statuses[i] = i < b->n_seats ? si : st;
    }
    tri_spec_batch_free(b);
    if (first) return tri__fail(first, "%s", msg);
    return TRI_STATUS_OK;
}

void tri__spec_batch_counts(const tri_spec_batch *b, int64_t *n_passes, int64_t *n_rows) {
    *n_passes = b->n_passes;
    *n_rows = b->n_rows;
}
