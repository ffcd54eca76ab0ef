# The public library and its installation.
#
# libzoe.so (target zoe_lib, exported as zoe::zoe): one shared library made of the engine's layer
# objects, all of them (core, io, optim, device, comm, config, offload, zero, checkpoint, and the
# CLI frame of zoe/cli.h), so a
# user links one file. Its optional dependencies (liburing, hwloc, oneTBB, MPI, gloo, CUDA, NCCL) are
# linked into it as found at configure time and reach a user's program through the library's own
# DT_NEEDED entries; a user needs none of their headers. The reference GPT (OpenBLAS) is not in it.
# Users compile against include/zoe/ only (C++17 or later).
#
# From a build tree:   add_subdirectory(zoe)  ->  target_link_libraries(app PRIVATE zoe::zoe)
# Installed:           cmake --install build --prefix P installs
#   P/include/zoe/*.h, P/lib/libzoe.so*, P/bin/zoe (the CLI), P/lib/cmake/zoe/ (find_package(zoe
#   CONFIG)), P/lib/pkgconfig/zoe.pc.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_zoe_layers zoe_core zoe_io zoe_optim zoe_device zoe_comm zoe_config zoe_offload zoe_zero zoe_checkpoint zoe_cli)
set(_zoe_objects "")
foreach(_l IN LISTS _zoe_layers)
  list(APPEND _zoe_objects $<TARGET_OBJECTS:${_l}>)
endforeach()
add_library(zoe_lib SHARED ${CMAKE_CURRENT_LIST_DIR}/libzoe.cpp ${_zoe_objects})
set_target_properties(zoe_lib PROPERTIES OUTPUT_NAME zoe EXPORT_NAME zoe VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
# The layers' objects are all in the library; linking their archives too brings their dependencies
# (the archives themselves add nothing: every symbol in them is already defined).
target_link_libraries(zoe_lib PRIVATE ${_zoe_layers})
# Every symbol resolved inside the library or its dependencies: a missing one fails here, not in a
# user's link (not under sanitizers, whose runtimes the executable brings).
if(NOT ZOE_SANITIZE)
  target_link_options(zoe_lib PRIVATE "LINKER:--no-undefined")
endif()
target_include_directories(zoe_lib INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(zoe_lib INTERFACE cxx_std_17)
add_library(zoe::zoe ALIAS zoe_lib)
# Installed binaries keep the directories of their dependencies outside the system's default
# search path (OpenMPI's lib directory on Debian) in their RUNPATH.
set_target_properties(zoe_lib zoe PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)

if(SKBUILD)
  # pip install .: libzoe.so and the CLI inside the Python package (python/CMakeLists.txt); the
  # C++ headers and CMake package come with `cmake --install`, not with the wheel.
  set_target_properties(zoe PROPERTIES INSTALL_RPATH "$ORIGIN/..")
  # One file, named by its SONAME (no libzoe.so.X.Y.Z beside it: a wheel holds no symlinks).
  set_target_properties(zoe_lib PROPERTIES INSTALL_RPATH "$ORIGIN"
                                           VERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  install(TARGETS zoe_lib LIBRARY DESTINATION zoe NAMELINK_SKIP)
  install(TARGETS zoe RUNTIME DESTINATION zoe/bin)
  return()
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(TARGETS zoe_lib EXPORT zoeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS zoe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(_zoe_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/zoe)
install(EXPORT zoeTargets NAMESPACE zoe:: DESTINATION ${_zoe_cmake_dir})
foreach(_dep URING HWLOC TBB MPI GLOO CUDA NCCL)
  set(ZOE_PACKAGE_HAVE_${_dep} ${ZOE_HAVE_${_dep}})
endforeach()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/zoeConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/zoeConfig.cmake INSTALL_DESTINATION ${_zoe_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/zoeConfigVersion.cmake VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/zoeConfig.cmake ${CMAKE_BINARY_DIR}/cmake/zoeConfigVersion.cmake
        DESTINATION ${_zoe_cmake_dir})

configure_file(${CMAKE_CURRENT_LIST_DIR}/zoe.pc.in ${CMAKE_BINARY_DIR}/cmake/zoe.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cmake/zoe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
