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

#if LOWBIT_HAS_CUDA_RUNTIME  // the macros exist where the CUDA runtime headers do
TEST_CASE("LOWBIT_CUDA_TRY turns a CUDA error code into cuda_error") {
  REQUIRE_THROWS_AS([] { LOWBIT_CUDA_TRY(cudaErrorInvalidValue); }(), lowbit::cuda_error);
  try {
    LOWBIT_CUDA_TRY(cudaErrorInvalidValue);
  } catch (const lowbit::cuda_error& e) {
    REQUIRE(e.code() == static_cast<int>(cudaErrorInvalidValue));
    REQUIRE(std::string(e.what()).find("cudaErrorInvalidValue") != std::string::npos);
  }
}
#endif

#if __has_include(<nccl.h>) && __has_include(<cuda_runtime.h>)
#include "lowbit/core/nccl_try.hpp"
TEST_CASE("LOWBIT_NCCL_TRY turns an NCCL error code into nccl_error") {
  REQUIRE_THROWS_AS([] { LOWBIT_NCCL_TRY(ncclInvalidArgument); }(), lowbit::nccl_error);
  REQUIRE_NOTHROW([] { LOWBIT_NCCL_TRY(ncclSuccess); }());
}
#endif

TEST_CASE("cuda_error, nccl_error and mpi_error are distinct coded_errors carrying their code") {
  const auto thrown_code = [](auto&& raise) {
    try {
      raise();
    } catch (const lowbit::coded_error& e) {
      REQUIRE(std::string(e.what()).find("error_test.cpp:") != std::string::npos);
      REQUIRE(e.message() == "it failed");
      return e.code();
    }
    return -1;
  };
  CHECK(thrown_code([] { throw lowbit::cuda_error(__FILE__, __LINE__, 7, "it failed"); }) == 7);
  CHECK(thrown_code([] { throw lowbit::nccl_error(__FILE__, __LINE__, 3, "it failed"); }) == 3);
  CHECK(thrown_code([] { throw lowbit::mpi_error(__FILE__, __LINE__, 15, "it failed"); }) == 15);

  // Each is caught by its own type (and lowbit::error), never by the others'.
  const auto raise_mpi = [] { throw lowbit::mpi_error(__FILE__, __LINE__, 1, "mpi"); };
  CHECK_THROWS_AS(raise_mpi(), lowbit::mpi_error);
  CHECK_THROWS_AS(raise_mpi(), lowbit::error);
  try {
    try {
      raise_mpi();
    } catch (const lowbit::cuda_error&) {
      FAIL("mpi_error caught as cuda_error");
    } catch (const lowbit::nccl_error&) {
      FAIL("mpi_error caught as nccl_error");
    }
  } catch (const lowbit::mpi_error& e) {
    CHECK(e.code() == 1);
  }
}
