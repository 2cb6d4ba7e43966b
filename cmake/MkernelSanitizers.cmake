# MKERNEL_SANITIZE=address adds ASan and UBSan, =thread adds TSan, to host code only (device code
# and nvcc's host pass are left alone: nvcc does not accept the sanitizer runtimes).
if(MKERNEL_SANITIZE STREQUAL "address")
  set(_mk_san -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
elseif(MKERNEL_SANITIZE STREQUAL "thread")
  set(_mk_san -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT MKERNEL_SANITIZE STREQUAL "")
  message(FATAL_ERROR "MKERNEL_SANITIZE='${MKERNEL_SANITIZE}': expected '', 'address' or 'thread'")
endif()
if(DEFINED _mk_san)
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:${_mk_san}>)
  add_link_options(${_mk_san})
  message(STATUS "mkernel: host code built with ${_mk_san}")
endif()
