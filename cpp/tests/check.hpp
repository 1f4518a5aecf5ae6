// The C++ tests' assertion macros: a failed CHECK prints where and counts,
// so one run reports every failing check; main() returns non-zero when any
// did (see report()).
#pragma once

#include <cstdio>

namespace skrull_test {
inline int failures = 0;

inline int report() {
  if (failures) std::fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
}  // namespace skrull_test

#define CHECK_MSG(cond, msg)                                                                           \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, (msg).c_str()); \
      ++skrull_test::failures;                                                                         \
    }                                                                                                  \
  } while (0)
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++skrull_test::failures;                                                      \
    }                                                                               \
  } while (0)
