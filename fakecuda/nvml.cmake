# fakecuda's NVML (nvml.c): build/tests/nvml/libnvidia-ml.so.1, linked to the plain fakecuda.
# Its own folder: only the runs that need NVML put it on their library path.
add_library(fakenvml SHARED "${CMAKE_CURRENT_LIST_DIR}/nvml.c")
target_include_directories(fakenvml SYSTEM PRIVATE "${PUMP_CUDA_INCLUDE_DIR}")
target_compile_options(fakenvml PRIVATE ${PUMP_TEST_WARNINGS} -fvisibility=hidden)
target_link_libraries(fakenvml PRIVATE fakecuda_plain)
set_target_properties(fakenvml PROPERTIES OUTPUT_NAME nvidia-ml SOVERSION 1 VERSION 1
                                          LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/nvml")
