# verify_unit.cmake: runs `systemd-analyze verify UNIT` and fails on a non-zero exit or on any
# output at all (systemd-analyze reports most problems as warnings and still exits 0).
# Usage: cmake -DANALYZE=/usr/bin/systemd-analyze -DUNIT=/path/mkerneld.service -P verify_unit.cmake
execute_process(COMMAND ${ANALYZE} verify ${UNIT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 50)
string(STRIP "${out}${err}" all)
if(NOT rc EQUAL 0 OR NOT all STREQUAL "")
  message(FATAL_ERROR "systemd-analyze verify ${UNIT} (exit ${rc}):\n${all}")
endif()
message(STATUS "systemd-analyze verify: ${UNIT}: no warnings")
