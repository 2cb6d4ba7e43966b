# FindCuTe: locate the CUTLASS / CuTe C++ headers shipped inside the `nvidia-cutlass` Python
# wheel (cutlass_library/source/include). No copy of CUTLASS lives in this repository.
#
# Search order: CUTE_INCLUDE_DIR (cache or environment), the project's dependency venv
# (.deps/venv, made by scripts/install-deps.sh), then whatever `python3 -c "import
# cutlass_library"` finds.
#
# Defines CuTe_FOUND, CuTe_INCLUDE_DIR, CuTe_VERSION and the imported target CuTe::CuTe.
if(NOT CUTE_INCLUDE_DIR AND DEFINED ENV{CUTE_INCLUDE_DIR})
  set(CUTE_INCLUDE_DIR "$ENV{CUTE_INCLUDE_DIR}")
endif()

set(_cute_hints)
if(CUTE_INCLUDE_DIR)
  list(APPEND _cute_hints "${CUTE_INCLUDE_DIR}")
endif()
file(GLOB _cute_venv_dirs
     "${PROJECT_SOURCE_DIR}/.deps/venv/lib/python3*/site-packages/cutlass_library/source/include"
     "${PROJECT_SOURCE_DIR}/.deps/cutlass/include")
list(APPEND _cute_hints ${_cute_venv_dirs})
if(NOT _cute_hints)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c
              "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
      OUTPUT_VARIABLE _cute_py_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_cute_py_dir)
      list(APPEND _cute_hints "${_cute_py_dir}")
    endif()
  endif()
endif()

find_path(CuTe_INCLUDE_DIR NAMES cute/tensor.hpp cutlass/version.h HINTS ${_cute_hints} NO_DEFAULT_PATH)
if(CuTe_INCLUDE_DIR AND EXISTS "${CuTe_INCLUDE_DIR}/cutlass/version.h")
  file(STRINGS "${CuTe_INCLUDE_DIR}/cutlass/version.h" _cute_ver REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*CUTLASS_MAJOR ([0-9]+).*" "\\1" _maj "${_cute_ver}")
  string(REGEX REPLACE ".*CUTLASS_MINOR ([0-9]+).*" "\\1" _min "${_cute_ver}")
  string(REGEX REPLACE ".*CUTLASS_PATCH ([0-9]+).*" "\\1" _pat "${_cute_ver}")
  set(CuTe_VERSION "${_maj}.${_min}.${_pat}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CuTe REQUIRED_VARS CuTe_INCLUDE_DIR VERSION_VAR CuTe_VERSION)
if(CuTe_FOUND AND NOT TARGET CuTe::CuTe)
  add_library(CuTe::CuTe INTERFACE IMPORTED)
  set_target_properties(CuTe::CuTe PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CuTe_INCLUDE_DIR}")
  # CuTe headers are third-party: keep their warnings out of our builds.
  set_target_properties(CuTe::CuTe PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CuTe_INCLUDE_DIR}")
endif()
mark_as_advanced(CuTe_INCLUDE_DIR)
