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

# libfakecuda_dlsym.so (dlsym_misses.c): the driver names fakecuda lacks, each resolving to NULL
# and counted, which libcuda.so.1 depends on so that a dlsym of one on its handle is seen. A
# Python package's build (scikit-build's SKBUILD: pump's package installs libcuda.so.1 alone)
# makes libcuda.so.1 without it; there such a lookup is a plain miss, not counted.
set(FAKECUDA_DLSYM_SOURCES ${CMAKE_CURRENT_LIST_DIR}/dlsym_misses.c)
if(SKBUILD)
  set(fakecuda_count_dlsym_default OFF)
else()
  set(fakecuda_count_dlsym_default ON)
endif()
option(FAKECUDA_COUNT_DLSYM "libcuda.so.1 depends on libfakecuda_dlsym.so, which counts dlsym lookups of the names fakecuda lacks"
       ${fakecuda_count_dlsym_default})

# fakecuda_driver_names(CUDA_INCLUDE_DIR OUT_DIR): OUT_DIR/fakecuda_driver_names.h, one
# FC_DRIVER_NAME(name) a line for every driver entry point name CUDA's headers in
# CUDA_INCLUDE_DIR declare (cuda.h and, where present, its interop and profiler headers: the API
# names, the ABI names they are #defined to, _v2 and the like, and the per-thread forms,
# __CUDA_API_PTDS/PTSZ: _ptds, _ptsz), less the exports fakecuda's cuGetProcAddress table names
# (procaddr.c, which checks each against its export at compile time). Read at configure time, and
# again when a header or the table changes.
function(fakecuda_driver_names cuda_include_dir out_dir)
  set(names "")
  foreach(header cuda.h cudaGL.h cudaEGL.h cudaVDPAU.h cudaProfiler.h)
    set(path "${cuda_include_dir}/${header}")
    if(NOT EXISTS "${path}")
      continue()
    endif()
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${path}")
    file(READ "${path}" text)
    # declarations: "CUresult CUDAAPI cuName(", the name sometimes on the next line
    string(REGEX MATCHALL "CUDAAPI[ \t\r\n]+cu[A-Z][A-Za-z0-9_]*[ \t]*\\(" decls "${text}")
    foreach(decl IN LISTS decls)
      string(REGEX MATCH "cu[A-Z][A-Za-z0-9_]*" name "${decl}")
      list(APPEND names ${name})
    endforeach()
    # "#define cuName cuName_v2" and "#define cuName __CUDA_API_PTSZ(cuName_v2)"
    string(REGEX MATCHALL "#[ \t]*define[ \t]+cu[A-Z][A-Za-z0-9_]*[ \t]+[A-Za-z_][A-Za-z0-9_]*(\\([A-Za-z0-9_]*\\))?"
           defines "${text}")
    foreach(define IN LISTS defines)
      if(define MATCHES "define[ \t]+(cu[A-Z][A-Za-z0-9_]*)[ \t]+__CUDA_API_PT(DS|SZ)\\((cu[A-Z][A-Za-z0-9_]*)\\)")
        string(TOLOWER "${CMAKE_MATCH_2}" suffix)
        list(APPEND names ${CMAKE_MATCH_1} ${CMAKE_MATCH_3} ${CMAKE_MATCH_3}_pt${suffix})
      elseif(define MATCHES "define[ \t]+(cu[A-Z][A-Za-z0-9_]*)[ \t]+(cu[A-Z][A-Za-z0-9_]*)$")
        list(APPEND names ${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
      endif()
    endforeach()
  endforeach()
  # the table's entries: X(base, version, ABI export, ...), an entry sometimes over lines
  set(table "${FAKECUDA_INCLUDE_DIR}/procaddr.c")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${table}")
  file(READ "${table}" text)
  string(REGEX MATCHALL "X\\(cu[A-Za-z0-9_]+,[ \t\r\n\\]*[0-9]+,[ \t\r\n\\]*cu[A-Za-z0-9_]+," entries "${text}")
  foreach(entry IN LISTS entries)
    string(REGEX MATCH "(cu[A-Za-z0-9_]+),$" export "${entry}")
    list(REMOVE_ITEM names ${CMAKE_MATCH_1})
  endforeach()
  list(REMOVE_DUPLICATES names)
  list(SORT names)
  list(TRANSFORM names PREPEND "FC_DRIVER_NAME(")
  list(TRANSFORM names APPEND ")")
  string(REPLACE ";" "\n" lines "${names}")
  # written only when it changes, so that a reconfigure rebuilds nothing
  file(CONFIGURE OUTPUT "${out_dir}/fakecuda_driver_names.h"
       CONTENT "/* Generated by fakecuda/sources.cmake from ${cuda_include_dir}: do not edit. */\n${lines}\n"
       @ONLY)
endfunction()

# fakecuda_library(TARGET CUDA_INCLUDE_DIR [FLAGS...]): libcuda.so.1 from FAKECUDA_SOURCES with
# CUDA's headers from CUDA_INCLUDE_DIR; FLAGS (a sanitizer's) go to the compiler and the linker.
# With FAKECUDA_COUNT_DLSYM, TARGET_dlsym too: libfakecuda_dlsym.so beside it, its dependency.
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
  if(FAKECUDA_COUNT_DLSYM)
    set(names_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_dlsym")
    fakecuda_driver_names("${cuda_include_dir}" "${names_dir}")
    add_library(${target}_dlsym SHARED ${FAKECUDA_DLSYM_SOURCES})
    target_include_directories(${target}_dlsym PRIVATE "${names_dir}" "${FAKECUDA_INCLUDE_DIR}")
    target_compile_options(${target}_dlsym PRIVATE -Wall -Wextra -Werror ${ARGN})
    target_link_libraries(${target}_dlsym PRIVATE ${CMAKE_DL_LIBS} ${ARGN})
    target_link_options(${target}_dlsym PRIVATE "-Wl,--version-script=${FAKECUDA_EXPORTS_MAP}")
    # beside libcuda.so.1 wherever its caller puts it, found there through $ORIGIN; named as a
    # dependency whatever the linker's default (--as-needed would drop it: nothing in libcuda.so.1
    # calls it)
    set_target_properties(${target}_dlsym PROPERTIES OUTPUT_NAME fakecuda_dlsym
                                                     LIBRARY_OUTPUT_DIRECTORY "$<TARGET_FILE_DIR:${target}>")
    target_link_libraries(${target} PRIVATE -Wl,--push-state,--no-as-needed ${target}_dlsym -Wl,--pop-state)
    set_property(TARGET ${target} APPEND PROPERTY BUILD_RPATH "\$ORIGIN")
  endif()
endfunction()

# fakecuda_selftest(TARGET LIBRARY [FLAGS...]): fakecuda_selftest, linked to LIBRARY.
function(fakecuda_selftest target library)
  add_executable(${target} ${FAKECUDA_SELFTEST_SOURCES})
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror ${ARGN})
  target_link_libraries(${target} PRIVATE ${library} ${CMAKE_DL_LIBS} pthread ${ARGN})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME fakecuda_selftest)
endfunction()
