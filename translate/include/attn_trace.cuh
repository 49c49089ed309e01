// Per-CTA timestamps of a kernel's phases, compiled in only with -DATTN_DECODE_TRACE (scripts/decode_trace.py builds
// and reads them): thread 0 of each CTA writes %globaltimer (ns) at ATTN_TRACE(slot) into attn_trace[8 * cta + slot]
// and its SM into slot 7. ATTN_TRACE_SYNC(slot) waits for the CTA first (a phase's end, not thread 0's). Without the
// macro both are empty statements: the measured kernels carry no trace code.
#ifndef ATTN_TRACE_CUH
#define ATTN_TRACE_CUH

#ifdef ATTN_DECODE_TRACE
constexpr int kAttnTraceSlots = 8, kAttnTraceCtas = 65536;
__device__ unsigned long long attn_trace[kAttnTraceSlots * kAttnTraceCtas];
__forceinline__ __device__ void attn_trace_write(int slot) {
  if (threadIdx.x != 0) { return; }
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= unsigned(kAttnTraceCtas)) { return; }
  unsigned long long now;
  unsigned sm;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  attn_trace[kAttnTraceSlots * cta + slot] = now;
  attn_trace[kAttnTraceSlots * cta + kAttnTraceSlots - 1] = sm;
}
#define ATTN_TRACE(slot) attn_trace_write(slot)
#define ATTN_TRACE_SYNC(slot) \
  do {                        \
    __syncthreads();          \
    attn_trace_write(slot);   \
  } while (0)
#else
#define ATTN_TRACE(slot) \
  do {                   \
  } while (0)
#define ATTN_TRACE_SYNC(slot) \
  do {                        \
  } while (0)
#endif

#endif  // ATTN_TRACE_CUH
