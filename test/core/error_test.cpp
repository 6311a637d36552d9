#include <catch2/catch.hpp>

#include <string>

#include "lowbit/core/error.hpp"

TEST_CASE("LOWBIT_EXPECTS throws invalid_argument carrying file:line and the message") {
  try {
    LOWBIT_EXPECTS(1 + 1 == 3, "arithmetic is broken");
    FAIL("no exception");
  } catch (const lowbit::invalid_argument& e) {
    const std::string what = e.what();
    REQUIRE(what.find("error_test.cpp:") != std::string::npos);
    REQUIRE(what.find("arithmetic is broken") != std::string::npos);
  }
  REQUIRE_NOTHROW([] { LOWBIT_EXPECTS(true, "never"); }());
}

TEST_CASE("LOWBIT_CUDA_TRY turns a CUDA error code into cuda_error") {
  REQUIRE_THROWS_AS([] { LOWBIT_CUDA_TRY(cudaErrorInvalidValue); }(), lowbit::cuda_error);
  try {
    LOWBIT_CUDA_TRY(cudaErrorInvalidValue);
  } catch (const lowbit::cuda_error& e) {
    REQUIRE(e.code() == static_cast<int>(cudaErrorInvalidValue));
    REQUIRE(std::string(e.what()).find("cudaErrorInvalidValue") != std::string::npos);
  }
}

TEST_CASE("LOWBIT_NCCL_TRY turns an NCCL error code into nccl_error") {
  REQUIRE_THROWS_AS([] { LOWBIT_NCCL_TRY(ncclInvalidArgument); }(), lowbit::nccl_error);
  REQUIRE_NOTHROW([] { LOWBIT_NCCL_TRY(ncclSuccess); }());
}
