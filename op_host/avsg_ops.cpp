// Operator schemas of the avsg namespace: the one place the torch-facing contract is declared.
//
// State is one int32 tensor [R, width] per buffer (layout: python/avsg/reference.py) plus an
// int64 stats tensor [R, 4]; both are updated in place, so every op is fixed-shape and a captured
// graph can replay it. Backends register implementations against these schemas:
//   CPU         the AscendC kernels compiled through the CPU emulation (or the Python reference)
//   PrivateUse1 the same kernels built by CANN (op_host/npu, only when CANN is found)
//   Meta        shape functions, registered from python/avsg/_ops.py
#include <torch/library.h>

TORCH_LIBRARY(avsg, m) {
    // One decode step: match topk_pos [R,T,K] against the resident entries, reserve slots for the
    // misses. Returns (slots [R,T,K], miss_pos [R,T*K], miss_slots [R,T*K], miss_counts [R]).
    // policy: 0 lifetime, 1 reuse (which needs max_context >= 1: per-position state); both are
    // recorded in the state's header by reset and checked here. valid_lens (int32 [R], optional):
    // first drop what invalidate(valid_lens) would, in the same launch (the serving path's one
    // launch per layer and pass).
    m.def("plan(Tensor topk_pos, Tensor seq_lens, Tensor(a!) state, Tensor(b!) stats, "
          "int capacity, int buckets, int lifetime, int policy=0, int max_context=0, "
          "Tensor? valid_lens=None) -> (Tensor, Tensor, Tensor, Tensor)");
    // Same contract and same results; matching by sort + two-pointer merge (baseline).
    m.def("plan_dual_pointer(Tensor topk_pos, Tensor seq_lens, Tensor(a!) state, Tensor(b!) stats, "
          "int capacity, int buckets, int lifetime, int policy=0, int max_context=0, "
          "Tensor? valid_lens=None) -> (Tensor, Tensor, Tensor, Tensor)");
    // Free every slot whose position is >= valid_lens[row] (MTP rejection).
    // Reuse policy: also zeroes the counts of the freed slots and of positions >= valid_lens.
    m.def("invalidate(Tensor(a!) state, Tensor valid_lens, int capacity, int buckets, "
          "int max_context=0) -> ()");
    // Return the rows selected by row_mask (bool [R]) to empty and write their header (geometry
    // and lifetime, which plan / invalidate check).
    m.def("reset(Tensor(a!) state, Tensor row_mask, int capacity, int buckets, int lifetime, "
          "int policy=0, int max_context=0) -> ()");
    // Set the active capacity of rows[i] (int64 [n]) to capacities[i] (int64 [n], in
    // [min_active = T*K, capacity]); a shrink evicts by the policy's order and moves the survivors
    // past the new capacity below it. Returns (src_slots [R, W], dst_slots [R, W], move_counts [R])
    // int32, W = max(1, capacity / 2), for gather(buffer -> buffer). Runs between steps.
    m.def("resize(Tensor(a!) state, Tensor rows, Tensor capacities, int capacity, int buckets, "
          "int lifetime, int policy, int max_context, int min_active) -> (Tensor, Tensor, Tensor)");
    // Copy the planned misses host -> buffer for every (src, dst) pair. partition is one of
    // "miss", "request", "topk". block_size is 0 for a contiguous pool. Returns int32 [num_cores]:
    // miss-list entries each core copied.
    m.def("gather(Tensor miss_pos, Tensor miss_slots, Tensor miss_counts, Tensor[] src, "
          "Tensor(a!)[] dst, Tensor? block_table, int block_size, str partition, int num_cores) "
          "-> Tensor");
    // plan (hash matcher, valid_lens as plan's), then gather of its misses (partition "miss",
    // "request" or "topk"), as ONE launch: the plan's work, a cross-core synchronisation, the
    // gather's copy (reference.plan_gather). Returns plan's four outputs and gather's int32
    // [num_cores]. For callers whose copy is the package's own gather; integrations that copy
    // with their own descriptors call plan.
    m.def("plan_gather(Tensor topk_pos, Tensor seq_lens, Tensor(a!) state, Tensor(b!) stats, "
          "int capacity, int buckets, int lifetime, int policy, int max_context, Tensor? valid_lens, "
          "Tensor[] src, Tensor(c!)[] dst, Tensor? block_table, int block_size, str partition, "
          "int num_cores) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
    // Calibration microkernel (op_kernel/calibrate_kernel.h), one block: `iters` repeats of one of
    // the plan kernel's operations, mode one of "scalar", "gather", "sort", "gathermask", over
    // values int32 [L] (L a power of two in [2048, 8192]). Returns int32 [kCalibOutLen]: an 8-word
    // header and the mode's checksum (op_host/calibrate_tiling.h). For `avsg bench calibrate`.
    m.def("calibrate(Tensor values, str mode, int iters) -> Tensor");
    // The hit/miss split of a plan's outputs (reference.split_slots): slots [R,T,K], miss_slots
    // [R,T*K], miss_counts [R] of a buffer of `capacity` slots per row. Returns (hits, misses),
    // int32 [R,T,K] each: per query token, the slots of its hits (resident before the step's
    // copy) and of its misses, valid entries first in selection order, then -1. One launch.
    m.def("split_slots(Tensor slots, Tensor miss_slots, Tensor miss_counts, int capacity) -> (Tensor, Tensor)");
}
