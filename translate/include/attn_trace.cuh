// Per-CTA timestamps of a kernel's phases, compiled in only with -DATTN_DECODE_TRACE (scripts/decode_trace.py builds
// and reads them): thread 0 of each CTA writes %globaltimer (ns) at ATTN_TRACE(slot) into attn_trace[8 * cta + slot]
// and its SM into slot 7. ATTN_TRACE_SYNC(slot) waits for the CTA first (a phase's end, not thread 0's). Without the
// macro both are empty statements: the measured kernels carry no trace code.
#ifndef ATTN_TRACE_CUH
#define ATTN_TRACE_CUH

#if defined(ATTN_DECODE_TRACE) || defined(ATTN_DECODE_WAITS)
constexpr int kAttnTraceCtas = 65536;   // the CTAs either record has room for; later ones record nothing
// the CTA's linear index in the grid, the row of its records
__forceinline__ __device__ unsigned attn_trace_cta() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
#endif

#ifdef ATTN_DECODE_TRACE
constexpr int kAttnTraceSlots = 8;
__device__ unsigned long long attn_trace[kAttnTraceSlots * kAttnTraceCtas];
__forceinline__ __device__ void attn_trace_write(int slot) {
  if (threadIdx.x != 0) { return; }
  const unsigned cta = attn_trace_cta();
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

// Where a kernel waits, compiled in only with -DATTN_DECODE_WAITS (scripts/decode_trace.py build --waits): the first
// thread of each warpgroup reads clock64 (SM cycles) around ATTN_WAIT(site, statement) and adds the difference to
// attn_waits[32 * cta + site]; ATTN_SPAN_BEGIN(t) / ATTN_SPAN_END(site, t) add a whole span (a loop) the same way,
// which the sites' shares are taken of. The stamps tell when a phase ends; these tell what its time went to
// waiting for (BENCHMARKS.md 2026-11-26: the seesaw's loop waits for its odd tile's reload).
#ifdef ATTN_DECODE_WAITS
constexpr int kAttnWaitSites = 32;   // scripts/decode_trace.py WAIT_SLOTS
__device__ unsigned long long attn_waits[kAttnWaitSites * kAttnTraceCtas];
__forceinline__ __device__ void attn_wait_add(int site, long long cycles) {
  if (threadIdx.x % 128 != 0) { return; }
  const unsigned cta = attn_trace_cta();
  if (cta >= unsigned(kAttnTraceCtas)) { return; }
  atomicAdd(&attn_waits[kAttnWaitSites * cta + site], static_cast<unsigned long long>(cycles));
}
#define ATTN_WAIT(site, ...)                       \
  do {                                             \
    const long long attn_wait_t0 = clock64();      \
    __VA_ARGS__;                                   \
    attn_wait_add(site, clock64() - attn_wait_t0); \
  } while (0)
#define ATTN_SPAN_BEGIN(t) const long long t = clock64()
#define ATTN_SPAN_END(site, t) attn_wait_add(site, clock64() - (t))
#else
#define ATTN_WAIT(site, ...) \
  do {                       \
    __VA_ARGS__;             \
  } while (0)
#define ATTN_SPAN_BEGIN(t) \
  do {                     \
  } while (0)
#define ATTN_SPAN_END(site, t) \
  do {                         \
  } while (0)
#endif

#endif  // ATTN_TRACE_CUH
