# Compiler warnings shared by every zoe target.
add_library(zoe_warnings INTERFACE)
target_compile_options(zoe_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter -Wshadow=local>)
# .cu files: the same host-compiler warnings through nvcc (not -Wpedantic: nvcc's generated host
# code uses GCC extensions).
target_compile_options(zoe_warnings INTERFACE
  "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Wshadow=local>")
if(ZOE_WERROR)
  target_compile_options(zoe_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
