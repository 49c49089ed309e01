// A C entry point over FlashMLA's Hopper dense decode (deepseek-ai/FlashMLA, built from a checkout by
// scripts/flashmla/build.sh, not part of this project), so that scripts/flashmla_check.py can time it through ctypes
// beside our absorbed-MLA decode kernels in one process. Layouts are FlashMLA's flash_mla_with_kvcache: q (b, s_q,
// h_q, 576) contiguous, k_cache (blocks, 64, 1, 576) contiguous, block_table (b, max_blocks) int32 rows contiguous,
// seqlens_k (b) int32; out (b, s_q, h_q, 512) contiguous, lse (b, s_q * h_q) fp32. One latent KV head (h_k = 1),
// where FlashMLA's (b, h_k, s_q * h_q / h_k, d) views of q and out are the contiguous tensors themselves.
#include <cmath>

#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

extern "C" {

// The SM partitions FlashMLA's scheduler splits the batch's key blocks over (its api: SMs / h_k / the 64-row
// q blocks of a KV head), and the int32 words of its per-partition metadata.
int flashmla_num_sm_parts(int num_sms, int s_q, int h_q) {
  const int q_blocks = (s_q * h_q + 63) / 64;
  return num_sms / q_blocks > 1 ? num_sms / q_blocks : 1;
}
int flashmla_meta_words() { return int(sizeof(DecodingSchedMeta) / sizeof(int)); }

// The schedule of one batch (FlashMLA's get_mla_metadata: once per decoding step, shared by the layers).
int flashmla_schedule(int* seqlens_k, int b, int s_q, int* meta, int* num_splits, int num_sm_parts, void* stream) {
  GetDecodeSchedMetaParams p = {b, s_q, 64, 5, -1, -1, nullptr, nullptr, seqlens_k,
                                reinterpret_cast<DecodingSchedMeta*>(meta), num_splits, num_sm_parts,
                                static_cast<cudaStream_t>(stream)};
  smxx::decode::run_get_decoding_sched_meta_kernel(p);
  return int(cudaGetLastError());
}

// The split kernel and the combine (flash_mla_with_kvcache). lse_accum / o_accum: (b + num_sm_parts) splits of
// s_q * h_q rows (x 512 for o_accum), fp32.
int flashmla_decode(void* q, void* k_cache, int* block_table, int* seqlens_k, void* out, float* lse, float* lse_accum,
                    float* o_accum, int* meta, int* num_splits, int b, int s_q, int h_q, int num_blocks,
                    int max_blocks, float softmax_scale, int causal, int num_sm_parts, void* stream) {
  const int d = 576, d_v = 512, rows = s_q * h_q;
  DenseAttnDecodeParams p{};
  p.b = b;
  p.s_q = s_q;
  p.q_seq_per_hk = rows;
  p.d = d;
  p.d_v = d_v;
  p.h_q = h_q;
  p.h_k = 1;
  p.num_blocks = num_blocks;
  p.q_head_per_hk = h_q;
  p.is_causal = causal && s_q > 1;   // FlashMLA's api: one token sees every key
  p.scale_softmax = softmax_scale;
  p.scale_softmax_log2 = float(softmax_scale * 1.4426950408889634);
  p.q_ptr = q;
  p.k_ptr = k_cache;
  p.o_ptr = out;
  p.softmax_lse_ptr = lse;
  p.q_batch_stride = int64_t(rows) * d;
  p.q_row_stride = d;
  p.q_head_stride = d;
  p.k_batch_stride = int64_t(64) * d;
  p.k_row_stride = d;
  p.k_head_stride = d;
  p.o_batch_stride = int64_t(rows) * d_v;
  p.o_row_stride = d_v;
  p.o_head_stride = int64_t(rows) * d_v;
  p.block_table = block_table;
  p.block_table_batch_stride = max_blocks;
  p.page_block_size = 64;
  p.seqlens_k_ptr = seqlens_k;
  p.tile_scheduler_metadata_ptr = reinterpret_cast<DecodingSchedMeta*>(meta);
  p.num_sm_parts = num_sm_parts;
  p.num_splits_ptr = num_splits;
  p.total_num_splits = b + num_sm_parts;
  p.softmax_lseaccum_ptr = lse_accum;
  p.oaccum_ptr = o_accum;
  p.stream = static_cast<cudaStream_t>(stream);
  sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);
  CombineParams c = {b, s_q, h_q, d_v,
                     lse, out, rows, h_q, rows * d_v, h_q * d_v, d_v,
                     lse_accum, o_accum, rows, h_q, rows * d_v, h_q * d_v, d_v,
                     p.tile_scheduler_metadata_ptr, num_splits, num_sm_parts, nullptr, p.stream};
  smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
  return int(cudaGetLastError());
}

}  // extern "C"
