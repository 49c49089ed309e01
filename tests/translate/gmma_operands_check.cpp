// Host-only check of the GMMA operand descriptors a warp-specialised Hopper kernel builds with
// attn_sm90::gmma_operand (translate/sm90/emit.py gmma_operand()) against CuTe's ThrMMA::partition_fragment_A/B,
// which the kernels called before: tests/translate/test_gmma_operands.py pastes each config's kernel_types()
// and the generator's choices (layout type, leading and stride byte offsets, swizzle, per-warpgroup start)
// in front of this file, one namespace per config.
//
// Per operand: the descriptor tensor's layout must be CuTe's very type (so cute::gemm runs the same loops), the
// descriptor's fields CuTe's (on the host make_gmma_desc cannot read a shared-memory address: the start is 0 on
// both sides), and, for every consumer thread, the start of its slice (the partition's pointer) the
// generator's: per_warpgroup x the thread's warpgroup (the M coordinate of its ThrMMA), 0 for B operands.
#include <cstdio>
#include <type_traits>

namespace check {
using namespace cute;

template <class Manual, int kLeading, int kStride, int kLayoutType, int kPerWarpgroup, class Frag>
int operand(const char* label, const char* what, Frag const& frag, long cute_offset, int warpgroup, int t) {
  int bad = 0;
  if (!std::is_same_v<std::decay_t<decltype(frag.layout())>, Manual>) {
    if (t == 0) { std::printf("  %s %s: layout ", label, what); print(frag.layout()); std::printf(" is CuTe's, the generator's ");
                  print(Manual{}); std::printf("\n"); }
    ++bad;
  }
  GmmaDescriptor desc = *frag.data();
  if (desc.bitfield.leading_byte_offset_ != kLeading || desc.bitfield.stride_byte_offset_ != kStride ||
      desc.bitfield.layout_type_ != kLayoutType || desc.bitfield.base_offset_ != 0) {
    if (t == 0) std::printf("  %s %s: CuTe's descriptor has leading %d stride %d layout type %d\n", label, what,
                            int(desc.bitfield.leading_byte_offset_), int(desc.bitfield.stride_byte_offset_),
                            int(desc.bitfield.layout_type_));
    ++bad;
  }
  if (cute_offset != long(kPerWarpgroup) * warpgroup) {
    std::printf("  %s %s: thread %d starts at element %ld in CuTe's partition, %ld here\n", label, what, t, cute_offset,
                long(kPerWarpgroup) * warpgroup);
    ++bad;
  }
  return bad;
}

}  // namespace check
