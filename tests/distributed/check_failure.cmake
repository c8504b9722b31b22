# Runs a failing data-parallel job and checks that it ends, with a non-zero status and the expected message,
# within LIMIT seconds (rather than hanging). Variables: COMMAND (a ;-list), EXPECT (a regex of the output),
# LIMIT (seconds).
string(TIMESTAMP start "%s")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${LIMIT})
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
message(STATUS "the job ended after ${seconds} s with status '${status}'")
if(status MATCHES "timeout")
  message(FATAL_ERROR "the job did not end within ${LIMIT} s: it hangs\n${out}\n${err}")
endif()
if(status EQUAL 0)
  message(FATAL_ERROR "the job exited with status 0 although rank 1 failed\n${out}\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}'\n${out}\n${err}")
endif()
message(STATUS "output:\n${err}")
