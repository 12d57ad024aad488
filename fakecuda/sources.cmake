# fakecuda/sources.cmake: the file lists of fakecuda (a CPU libcuda.so.1) and the two functions
# that build it and its self-test, for a CMake project to include(): fakecuda's own
# (CMakeLists.txt beside this file) and pump's, whose tests build it plain and under each
# sanitizer and whose package carries a copy. Paths are anchored at this file's directory. The
# version script keeps the exports to cu* and fakecuda_*; cuGetProcAddress returns the same
# pointers as dlsym.

set(FAKECUDA_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/device.c
    ${CMAKE_CURRENT_LIST_DIR}/memory.c
    ${CMAKE_CURRENT_LIST_DIR}/migrate.c
    ${CMAKE_CURRENT_LIST_DIR}/fault_prefetch.c
    ${CMAKE_CURRENT_LIST_DIR}/pointers.c
    ${CMAKE_CURRENT_LIST_DIR}/pools.c
    ${CMAKE_CURRENT_LIST_DIR}/devmem.c
    ${CMAKE_CURRENT_LIST_DIR}/vmm.c
    ${CMAKE_CURRENT_LIST_DIR}/prefetch.c
    ${CMAKE_CURRENT_LIST_DIR}/discard_races.c
    ${CMAKE_CURRENT_LIST_DIR}/copies.c
    ${CMAKE_CURRENT_LIST_DIR}/cost.c
    ${CMAKE_CURRENT_LIST_DIR}/streams.c
    ${CMAKE_CURRENT_LIST_DIR}/stream_queries.c
    ${CMAKE_CURRENT_LIST_DIR}/events.c
    ${CMAKE_CURRENT_LIST_DIR}/capture.c
    ${CMAKE_CURRENT_LIST_DIR}/graphs.c
    ${CMAKE_CURRENT_LIST_DIR}/kernels.c
    ${CMAKE_CURRENT_LIST_DIR}/launch_uses.c
    ${CMAKE_CURRENT_LIST_DIR}/modules.c
    ${CMAKE_CURRENT_LIST_DIR}/images.c
    ${CMAKE_CURRENT_LIST_DIR}/tensor_lists.c
    ${CMAKE_CURRENT_LIST_DIR}/fatbin.c
    ${CMAKE_CURRENT_LIST_DIR}/cubin.c
    ${CMAKE_CURRENT_LIST_DIR}/tensor_maps.c
    ${CMAKE_CURRENT_LIST_DIR}/procaddr.c
    ${CMAKE_CURRENT_LIST_DIR}/stats.c
    ${CMAKE_CURRENT_LIST_DIR}/not_found.c
    ${CMAKE_CURRENT_LIST_DIR}/persona.c
    ${CMAKE_CURRENT_LIST_DIR}/export_tables.c
    ${CMAKE_CURRENT_LIST_DIR}/context_storage.c
    ${CMAKE_CURRENT_LIST_DIR}/integrity.c
    ${CMAKE_CURRENT_LIST_DIR}/context_extras.c
    ${CMAKE_CURRENT_LIST_DIR}/green_contexts.c
    ${CMAKE_CURRENT_LIST_DIR}/func_attributes.c
    ${CMAKE_CURRENT_LIST_DIR}/stream_memops.c
    ${CMAKE_CURRENT_LIST_DIR}/link.c
    ${CMAKE_CURRENT_LIST_DIR}/host_memory.c
)
set(FAKECUDA_HEADERS
    ${CMAKE_CURRENT_LIST_DIR}/fakecuda.h
    ${CMAKE_CURRENT_LIST_DIR}/fakecuda_model.h
    ${CMAKE_CURRENT_LIST_DIR}/fakecuda_internal.h
    ${CMAKE_CURRENT_LIST_DIR}/image.h
    ${CMAKE_CURRENT_LIST_DIR}/cuda_compat.h
    ${CMAKE_CURRENT_LIST_DIR}/memory_pages.h
)
set(FAKECUDA_INCLUDE_DIR ${CMAKE_CURRENT_LIST_DIR})
# Loads image files and prints what the driver answered (tests/test_fakecuda_images.py).
set(FAKECUDA_IMAGE_PROBE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/image_probe.c)
set(FAKECUDA_EXPORTS_MAP ${CMAKE_CURRENT_LIST_DIR}/exports.map)
set(FAKECUDA_SELFTEST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/selftest.c ${CMAKE_CURRENT_LIST_DIR}/selftest_driver.c
    ${CMAKE_CURRENT_LIST_DIR}/selftest_contexts.c ${CMAKE_CURRENT_LIST_DIR}/selftest_copies.c
    ${CMAKE_CURRENT_LIST_DIR}/selftest_pools.c ${CMAKE_CURRENT_LIST_DIR}/selftest_faults.c
    ${CMAKE_CURRENT_LIST_DIR}/selftest_memory.c ${CMAKE_CURRENT_LIST_DIR}/selftest_read_mostly.c
    ${CMAKE_CURRENT_LIST_DIR}/selftest_launches.c ${CMAKE_CURRENT_LIST_DIR}/selftest_graphs.c
    ${CMAKE_CURRENT_LIST_DIR}/selftest_runtime.c ${CMAKE_CURRENT_LIST_DIR}/selftest_clock.c
    ${CMAKE_CURRENT_LIST_DIR}/selftest_launch_uses.c ${CMAKE_CURRENT_LIST_DIR}/selftest_context_work.c)

# fakecuda_library(TARGET CUDA_INCLUDE_DIR [FLAGS...]): libcuda.so.1 from FAKECUDA_SOURCES with
# CUDA's headers from CUDA_INCLUDE_DIR; FLAGS (a sanitizer's) go to the compiler and the linker.
function(fakecuda_library target cuda_include_dir)
  add_library(${target} SHARED ${FAKECUDA_SOURCES})
  target_include_directories(${target} PUBLIC "${FAKECUDA_INCLUDE_DIR}")
  target_include_directories(${target} SYSTEM PUBLIC "${cuda_include_dir}")
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror ${ARGN})
  target_compile_definitions(${target} PRIVATE _GNU_SOURCE)
  target_link_libraries(${target} PRIVATE pthread m ${CMAKE_DL_LIBS} ${ARGN})
  target_link_options(${target} PRIVATE "-Wl,--version-script=${FAKECUDA_EXPORTS_MAP}")
  set_target_properties(${target} PROPERTIES OUTPUT_NAME cuda SOVERSION 1 VERSION 1
                                             LINK_DEPENDS "${FAKECUDA_EXPORTS_MAP}")
endfunction()

# fakecuda_selftest(TARGET LIBRARY [FLAGS...]): fakecuda_selftest, linked to LIBRARY.
function(fakecuda_selftest target library)
  add_executable(${target} ${FAKECUDA_SELFTEST_SOURCES})
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror ${ARGN})
  target_link_libraries(${target} PRIVATE ${library} ${CMAKE_DL_LIBS} pthread ${ARGN})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME fakecuda_selftest)
endfunction()
