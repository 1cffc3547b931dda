// The host's kind as the kernels choose their variants by it: a variant that pays on one kind of CPU
// can cost on another with the same instruction sets (AMD Zen 4 runs a 512-bit vector as two 256-bit
// halves, Zen 5 whole), and no instruction-set check tells them apart. Read once from cpuid.
#pragma once
#include <cpuid.h>

// The CPU's family number where it is AMD's (25: Zen 3 and Zen 4, 26: Zen 5); 0 for any other vendor.
inline unsigned amd_family() {
  static const unsigned family = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != signature_AMD_ebx) return 0u;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0u;
    const unsigned base = (a >> 8) & 0xF;
    return base == 0xF ? base + ((a >> 20) & 0xFF) : base;
  }();
  return family;
}
