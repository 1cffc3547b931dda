// How a pass's units are shared out over threads: thread t of n takes the contiguous units
// [t * units / n, (t + 1) * units / n). Attention's scores pass and a projection's owner shares
// (kquants' balanced_for) split this way, and layer.cpp's `warm` reads the same split to ask each
// thread's first reads ahead: one definition, so a change of the split moves them all.
#pragma once
#include <cstdint>
#include <utility>

inline std::pair<int64_t, int64_t> even_share(int64_t units, int64_t t, int64_t n) {
  return {t * units / n, (t + 1) * units / n};
}
