// Status: where an error was made travels with it (origin from the constructor's defaulted
// source location, the trail from the MK_* macros) and shows in to_string(); message() stays the
// text alone; with_context keeps the origin.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "mkernel/common/status.h"

using mkernel::Status;
using mkernel::StatusCode;
using mkernel::StatusOr;

namespace {

constexpr uint32_t kMadeAt = __LINE__ + 1;
Status make_error() { return Status(StatusCode::kInvalidArgument, "capacity_log2: 25; expected 1..20"); }

constexpr uint32_t kPassedAt = __LINE__ + 2;
Status pass_it_up() {
  MK_RETURN_IF_ERROR(make_error());
  return Status::Ok();
}

StatusOr<int> value_or_error(bool fail) {
  if (fail) return make_error();
  return 7;
}

constexpr uint32_t kAssignedAt = __LINE__ + 2;
Status assign_it() {
  MK_ASSIGN_OR_RETURN(int v, value_or_error(true));
  return v == 7 ? Status::Ok() : Status(StatusCode::kInternal, "unexpected");
}

}  // namespace

TEST(Status, CarriesTheFileAndLineThatMadeIt) {
  const Status s = make_error();
  EXPECT_EQ(s.file(), "status_test.cc");
  EXPECT_EQ(s.line(), kMadeAt);
  EXPECT_EQ(s.message(), "capacity_log2: 25; expected 1..20") << "the message is the text alone";
  EXPECT_EQ(s.to_string(), "invalid argument: capacity_log2: 25; expected 1..20 (at status_test.cc:" +
                               std::to_string(kMadeAt) + ")");
}

TEST(Status, TheMacrosAddEachLineThatPassedItUp) {
  const Status s = pass_it_up();
  EXPECT_EQ(s.line(), kMadeAt);
  EXPECT_EQ(s.where(), "status_test.cc:" + std::to_string(kMadeAt) + " via status_test.cc:" +
                           std::to_string(kPassedAt));
  const Status a = assign_it();
  EXPECT_EQ(a.where(), "status_test.cc:" + std::to_string(kMadeAt) + " via status_test.cc:" +
                           std::to_string(kAssignedAt));
}

TEST(Status, ContextKeepsTheOrigin) {
  const Status s = pass_it_up().with_context("session 3");
  EXPECT_EQ(s.message(), "session 3: capacity_log2: 25; expected 1..20");
  EXPECT_EQ(s.line(), kMadeAt);
  EXPECT_TRUE(std::regex_match(s.to_string(),
                               std::regex(R"(invalid argument: session 3: capacity_log2: 25; expected 1\.\.20 )"
                                          R"(\(at status_test\.cc:\d+ via status_test\.cc:\d+\))")))
      << s.to_string();
}

TEST(Status, TheTwoArgumentConstructorAndBracesStillWork) {
  const Status a(StatusCode::kNotFound, "gpu 9");
  const Status b = {StatusCode::kNotFound, "gpu 9"};
  EXPECT_EQ(a.code(), b.code());
  EXPECT_EQ(a.message(), b.message());
  EXPECT_EQ(a.file(), "status_test.cc");
  EXPECT_EQ(b.line(), a.line() + 1);
}

TEST(Status, OkHasNoPlace) {
  EXPECT_EQ(Status::Ok().to_string(), "ok");
  EXPECT_EQ(Status::Ok().where(), "");
  EXPECT_EQ(Status::Ok().line(), 0u);
  const Status goodbye(StatusCode::kOk, "client said goodbye");
  EXPECT_TRUE(goodbye.ok());
  EXPECT_EQ(goodbye.to_string(), "ok");
  EXPECT_EQ(Status::Ok().with_context("x").to_string(), "ok");
}

TEST(Status, ErrnoStatusIsMadeAtItsCaller) {
  const uint32_t line = __LINE__ + 1;
  const Status s = mkernel::errno_status("open /nowhere", ENOENT);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), "open /nowhere: No such file or directory");
  EXPECT_EQ(s.file(), "status_test.cc");
  EXPECT_EQ(s.line(), line);
}

TEST(Status, StatusOrFromAnOkStatusIsAnInternalError) {
  const StatusOr<int> v(Status::Ok());
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
  EXPECT_EQ(v.status().file(), "status.h");
}
