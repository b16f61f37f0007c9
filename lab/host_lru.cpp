// The lab's native code: a C statement of vllm-ascend's per-layer host LRU (its sparse KV
// offload's residency step), timed by `avsg bench decode` for its `lru-host` peer
// (python/avsg/costmodel/host_lru.py). Our own implementation, learned from the design: no code
// taken. Compiled into the op library by CMake like the rest of the native code and exported as
// a C symbol, which the lab calls through ctypes; nothing is compiled at run time.
#include <stdint.h>

/* rows x K selections (int32, -1 = none). Per row: slot_pos[S] (position held, -1 empty),
   order[S] (slots, least recently used first). Workspace: mark/where [max_pos], scratch [3 S].
   Out: slot_of[rows x K], misses[rows], descriptors (3 int64 per descriptor, 2 per miss). */
extern "C" __attribute__((visibility("default")))
int64_t host_lru_rows(int32_t rows, int32_t K, int32_t S, int32_t max_pos,
                      const int32_t *sel, const int32_t *valid_len,
                      int32_t *slot_pos, int32_t *order, int32_t *slot_of, int32_t *misses,
                      int32_t *mark, int32_t *where, int32_t *epoch, int32_t *scratch,
                      int64_t *desc, int32_t block, int64_t latent_bytes, int64_t rope_bytes) {
  int64_t total = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const int32_t *s = sel + (int64_t)r * K;
    int32_t *sp = slot_pos + (int64_t)r * S, *ord = order + (int64_t)r * S;
    int32_t *out = slot_of + (int64_t)r * K;
    int32_t *hit = scratch, *evict = scratch + S, *filled = scratch + 2 * S;
    int32_t e = ++*epoch, nh = 0, ne = 0, nm = 0;
    for (int32_t i = 0; i < K; ++i) {
      out[i] = -1;
      int32_t p = s[i];
      if (p >= 0 && p < max_pos && mark[p] != e) { mark[p] = e; where[p] = i; }
    }
    for (int32_t j = 0; j < S; ++j) {
      int32_t slot = ord[j], p = sp[slot];
      if (p >= valid_len[r]) { sp[slot] = -1; p = -1; }
      if (p >= 0 && mark[p] == e) { out[where[p]] = slot; hit[nh++] = slot; }
      else evict[ne++] = slot;
    }
    for (int32_t i = 0; i < K && nm < ne; ++i) {
      int32_t p = s[i];
      if (p < 0 || p >= max_pos || out[i] >= 0 || where[p] != i) continue;
      int32_t slot = evict[nm];
      sp[slot] = p; out[i] = slot; filled[nm] = slot;
      int64_t *d = desc + 6 * (total + nm);
      int64_t page = p / block, in_page = p % block;
      d[0] = page * block * latent_bytes + in_page * latent_bytes;
      d[1] = ((int64_t)r * S + slot) * latent_bytes; d[2] = latent_bytes;
      d[3] = page * block * rope_bytes + in_page * rope_bytes;
      d[4] = ((int64_t)r * S + slot) * rope_bytes; d[5] = rope_bytes;
      ++nm;
    }
    int32_t w = 0;
    for (int32_t j = nm; j < ne; ++j) ord[w++] = evict[j];
    for (int32_t j = 0; j < nm; ++j) ord[w++] = filled[j];
    for (int32_t j = 0; j < nh; ++j) ord[w++] = hit[j];
    misses[r] = nm;
    total += nm;
  }
  return total;
}
