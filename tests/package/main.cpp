#include <iostream>

#include "comm/error.h"

int main() {
  try {
    HSGD_CHECK(1 + 1 == 3, "arithmetic");
  } catch (const hsgd::InvalidArgument& e) {
    std::cout << "hsgd package ok\n";
    return 0;
  }
  std::cout << "HSGD_CHECK did not throw\n";
  return 1;
}
