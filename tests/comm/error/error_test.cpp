#include "comm/error.h"

#include <gtest/gtest.h>

namespace hsgd {
namespace {

TEST(Error, Check_MessageNamesValuesExpressionAndLocation) {
  int last = 6, size = 8;
  try {
    HSGD_CHECK(last == size, "last group size ", last, " must equal the group size ", size);
    FAIL() << "HSGD_CHECK did not throw";
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("last group size 6 must equal the group size 8"), std::string::npos)
        << what;
    EXPECT_NE(what.find("'last == size'"), std::string::npos) << what;
    EXPECT_NE(what.find("error_test.cpp:"), std::string::npos) << what;
  }
}

TEST(Error, CheckEq_MessageCarriesBothValues) {
  try {
    HSGD_CHECK_EQ(3, 4, "sizes differ");
    FAIL() << "HSGD_CHECK_EQ did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sizes differ (got 3 vs 4)"), std::string::npos)
        << e.what();
  }
}

TEST(Error, CheckAs_ThrowsRequestedSubclass) {
  EXPECT_THROW(HSGD_CHECK_AS(Timeout, false, "late"), Timeout);
  EXPECT_THROW(HSGD_CHECK_AS(Timeout, false), CommError);
  EXPECT_NO_THROW(HSGD_CHECK_AS(Timeout, true, "fine"));
}

TEST(Error, Hierarchy_AllDeriveFromError) {
  EXPECT_THROW(throw Timeout("t"), Error);
  EXPECT_THROW(throw CommError("c"), Error);
  EXPECT_THROW(throw InvalidArgument("i"), Error);
}

}  // namespace
}  // namespace hsgd
