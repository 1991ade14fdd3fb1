// fuzz-curve.c - libFuzzer target for acceptance curve files (tri__sim_curve_parse, a file a user
// passes to bench-offload --accept-curve). A curve that parses has both chain levels with rates in
// [0, 1] and tree ranks within the limits, and its acceptance table feeds the tree programme.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "planner.h"
#include "sim-backend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(tri_log_level level, const char *msg, void *user) { (void)level, (void)msg, (void)user; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tri_log_set(quiet, NULL, TRI_LOG_LEVEL_ERROR);
    static tri__sim_curve c;
    if (tri__sim_curve_parse("fuzz.curve", (const char *)data, size, &c) != TRI_STATUS_OK) return 0;
    for (int w = 0; w < 2; w++) {
        TRI_ASSERT(c.depth[w] >= 1 && c.depth[w] <= TRI_SIM_CURVE_DEPTH);
        TRI_ASSERT(c.pooled[w] >= 0 && c.pooled[w] <= 1);
        for (int32_t d = 1; d <= c.depth[w]; d++) TRI_ASSERT(c.rate[w][d] >= 0 && c.rate[w][d] <= 1);
    }
    TRI_ASSERT(c.tree_depth >= 0 && c.tree_depth <= TRI_SIM_CURVE_DEPTH);
    for (int32_t d = 1; d <= c.tree_depth; d++)
        TRI_ASSERT(c.tree_ranks[d] >= 1 && c.tree_ranks[d] <= TRI_SIM_TREE_RANKS);
    static tri__accept_table t;
    static tri__tree_shape s;
    tri__sim_curve_table(&c, 1, 0.5, &t, NULL);
    int32_t n = size > 0 ? data[0] % 33 : 8;
    TRI_ASSERT(tri__accept_tree_best(&t, n, 0, size % 2 == 0, &s) == TRI_STATUS_OK);
    TRI_ASSERT(s.n <= n && s.expected >= 1 && s.expected <= n + 1 + 1e-9);
    TRI_ASSERT(tri__sim_curve_expected(&c, 1, 16) >= 1);
    return 0;
}
