# ZOE_SANITIZE=address,undefined builds everything with those sanitizers.
if(ZOE_SANITIZE)
  string(REPLACE "," ";" _zoe_sanitizers "${ZOE_SANITIZE}")
  foreach(_s IN LISTS _zoe_sanitizers)
    if(NOT _s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "ZOE_SANITIZE: unknown sanitizer '${_s}' (expected address, undefined, thread, leak)")
    endif()
  endforeach()
  string(REPLACE ";" "," _zoe_san_flag "${_zoe_sanitizers}")
  # Host languages only: nvcc does not take -fsanitize (device code is checked on GPUs instead).
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${_zoe_san_flag};-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  add_link_options(-fsanitize=${_zoe_san_flag})
  message(STATUS "zoe: sanitizers: ${_zoe_san_flag}")
endif()
