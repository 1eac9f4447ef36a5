# Runs a command and checks its exit code and output (ctest's PASS_REGULAR_EXPRESSION alone
# would ignore the exit code). Variables (-D):
#   CMD          the command, arguments separated by '|'
#   EXPECT_RC    the exit code it must return
#   EXPECT_REGEX regular expressions (separated by '|||') that stdout+stderr must each match
#   RUN_TIMEOUT  seconds after which the command is killed (fails the test)
string(REPLACE "|" ";" command "${CMD}")
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${RUN_TIMEOUT})
set(all "${out}\n${err}")
message("${all}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit code '${rc}', expected ${EXPECT_RC}")
endif()
string(REPLACE "|||" ";" regexes "${EXPECT_REGEX}")
foreach(regex IN LISTS regexes)
  if(NOT all MATCHES "${regex}")
    message(FATAL_ERROR "output does not match '${regex}'")
  endif()
endforeach()
