# check_nofile.cmake: the unit's LimitNOFILE= equals what `mkerneld --check-config` says the
# built-in config needs (clients.max_descriptors + the descriptors kept for admin and peers).
# Usage: cmake -DMKERNELD=... -DUNIT=.../mkerneld.service -DWORK=dir -P check_nofile.cmake
file(STRINGS ${UNIT} limit_lines REGEX "^LimitNOFILE=")
list(LENGTH limit_lines n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "${UNIT}: expected one LimitNOFILE= line, found ${n}")
endif()
string(REGEX REPLACE "^LimitNOFILE=" "" unit_value "${limit_lines}")
file(WRITE ${WORK}/empty-config.yaml "# the built-in default\n")
execute_process(COMMAND ${MKERNELD} --check-config ${WORK}/empty-config.yaml
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mkerneld --check-config failed (${rc}): ${out}${err}")
endif()
string(REGEX MATCH "LimitNOFILE=([0-9]+)" found "${out}")
if(NOT found)
  message(FATAL_ERROR "mkerneld --check-config did not say what LimitNOFILE it needs:\n${out}")
endif()
if(NOT CMAKE_MATCH_1 EQUAL unit_value)
  message(FATAL_ERROR "${UNIT}: LimitNOFILE=${unit_value}, but the built-in config needs ${CMAKE_MATCH_1}")
endif()
message(STATUS "LimitNOFILE=${unit_value}: what the built-in config needs")
