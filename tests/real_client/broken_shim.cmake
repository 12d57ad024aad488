# libpump with its launch scan cut to a launch's first 8 parameters (build/tests/scan8/libpump.so):
# tests/test_real_client_allocators.py runs the real client on it to see its layout check fail
# (cuBLAS's sgemm kernels take pointers past their eighth parameter). A patched copy of
# shim/lookup/scan.c made here, in the test build only: nothing a user installs can scan less.
set(scan_source "${PROJECT_SOURCE_DIR}/shim/lookup/scan.c")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${scan_source}")
file(READ "${scan_source}" scan_text)
set(scan_whole "const struct pump_word *run = &layout->word[r];\n            if (!add_words(g, wide, (const char *)params[")
set(scan_cut "const struct pump_word *run = &layout->word[r];\n            if (run->param < 8 && !add_words(g, wide, (const char *)params[")
string(REPLACE "${scan_whole}" "${scan_cut}" scan8_text "${scan_text}")
if(scan8_text STREQUAL scan_text)
  message(FATAL_ERROR "tests/real_client/broken_shim.cmake: shim/lookup/scan.c's kernelParams loop changed; update the patch")
endif()
file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/scan8/src/scan.c" "${scan8_text}")

set(scan8_sources ${PUMP_SOURCES})
list(REMOVE_ITEM scan8_sources "${scan_source}")
list(APPEND scan8_sources "${CMAKE_CURRENT_BINARY_DIR}/scan8/src/scan.c")
add_library(pump_scan8 SHARED ${scan8_sources})
target_include_directories(pump_scan8 PRIVATE ${PUMP_SHIM_INCLUDE_DIRS})
target_include_directories(pump_scan8 SYSTEM PRIVATE "${PUMP_CUDA_INCLUDE_DIR}")
target_compile_options(pump_scan8 PRIVATE ${PUMP_WARNINGS} -fvisibility=hidden -fno-semantic-interposition)
target_compile_definitions(pump_scan8 PRIVATE _GNU_SOURCE)
target_link_libraries(pump_scan8 PRIVATE ${CMAKE_DL_LIBS} pthread)
target_link_options(pump_scan8 PRIVATE "-Wl,--version-script=${PROJECT_SOURCE_DIR}/shim/exports.map"
                    -Wl,-z,defs -Wl,-Bsymbolic-functions)
set_target_properties(pump_scan8 PROPERTIES OUTPUT_NAME pump LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/scan8")
