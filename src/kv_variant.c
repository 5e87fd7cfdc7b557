/* Which kernel variant served the last KV launch, and a switch that forces
 * the generic (descriptor-driven) kernels, so specs can run both the
 * compile-time-specialized variants (instantiated from
 * kernels_rtc/include/mla/builtin_layouts.h) and the generic path on the same
 * data and prove a built-in layout really took its specialized variant. */
#include "kernels/kv_kernels.h"

static int specialize_on = 1;
static const char *last_variant = "none";

int mla_cuda_kv_set_specialize(int on) {
  int was = specialize_on;
  specialize_on = on != 0;
  return was;
}

int mla_cuda_kv_specialize(void) { return specialize_on; }

void mla_cuda_kv_note_variant(const char *name) { last_variant = name ? name : "generic"; }

const char *mla_cuda_kv_last_variant(void) { return last_variant; }
