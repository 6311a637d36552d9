# Runs CMD (a ;-list) and fails unless it exits with EXPECT_CODE and prints EXPECT_TEXT
# on stdout or stderr. Used by the lowbit-plan bad-input tests.
execute_process(COMMAND ${CMD} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL EXPECT_CODE)
  message(FATAL_ERROR "expected exit code ${EXPECT_CODE}, got ${code}\n${out}\n${err}")
endif()
string(FIND "${out}${err}" "${EXPECT_TEXT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "expected the output to contain '${EXPECT_TEXT}'\n${out}\n${err}")
endif()
message(STATUS "exit ${code} as expected: ${err}")
