# Finds zoe's dependencies and prints one summary line for each optional one.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)

set(_zoe_summary "")
macro(zoe_summary name found detail)
  if(${found})
    list(APPEND _zoe_summary "  ${name}: yes ${detail}")
  else()
    list(APPEND _zoe_summary "  ${name}: no ${detail}")
  endif()
endmacro()

# liburing: the io_uring backend of the I/O engine (the thread-pool backend is always built).
pkg_check_modules(URING IMPORTED_TARGET liburing)
set(ZOE_HAVE_URING ${URING_FOUND})
zoe_summary("liburing" ZOE_HAVE_URING "${URING_VERSION}")

# hwloc: topology (NUMA nodes, cores, binding).
pkg_check_modules(HWLOC IMPORTED_TARGET hwloc)
set(ZOE_HAVE_HWLOC ${HWLOC_FOUND})
zoe_summary("hwloc" ZOE_HAVE_HWLOC "${HWLOC_VERSION}")

# oneTBB: parallel loops in the CPU optimizer.
find_package(TBB CONFIG QUIET)
set(ZOE_HAVE_TBB ${TBB_FOUND})
zoe_summary("oneTBB" ZOE_HAVE_TBB "${TBB_VERSION}")

# xxhash: checksums.
pkg_check_modules(XXHASH IMPORTED_TARGET libxxhash)
set(ZOE_HAVE_XXHASH ${XXHASH_FOUND})
zoe_summary("xxhash" ZOE_HAVE_XXHASH "${XXHASH_VERSION}")

# MPI: launcher, bootstrap and host collectives.
set(ZOE_HAVE_MPI OFF)
if(NOT ZOE_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(ZOE_HAVE_MPI ON)
    # zoe uses MPI's C API from C++: keep OpenMPI's/MPICH's C++ bindings out.
    set_property(TARGET MPI::MPI_C APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  elseif(ZOE_MPI STREQUAL "ON")
    message(FATAL_ERROR "ZOE_MPI=ON but no MPI was found (apt-get install libopenmpi-dev openmpi-bin)")
  endif()
endif()
zoe_summary("MPI" ZOE_HAVE_MPI "${MPI_C_LIBRARY_VERSION_STRING}")

# gloo: host collectives under torchrun (Debian's libgloo-dev installs its CMake package).
set(ZOE_HAVE_GLOO OFF)
if(NOT ZOE_GLOO STREQUAL "OFF")
  find_package(Gloo CONFIG QUIET)
  if(TARGET gloo)
    set(ZOE_HAVE_GLOO ON)
  elseif(ZOE_GLOO STREQUAL "ON")
    message(FATAL_ERROR "ZOE_GLOO=ON but gloo was not found (apt-get install libgloo-dev)")
  endif()
endif()
zoe_summary("gloo" ZOE_HAVE_GLOO "${Gloo_VERSION}")

# CUDA toolkit and NCCL, from /usr/local/cuda unless CUDAToolkit_ROOT says otherwise.
set(ZOE_HAVE_CUDA OFF)
set(ZOE_HAVE_NCCL OFF)
if(NOT ZOE_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(ZOE_HAVE_CUDA ON)
    find_library(ZOE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib64)
    find_path(ZOE_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include)
    if(ZOE_NCCL_LIBRARY AND ZOE_NCCL_INCLUDE)
      set(ZOE_HAVE_NCCL ON)
      add_library(zoe_nccl INTERFACE)
      target_link_libraries(zoe_nccl INTERFACE ${ZOE_NCCL_LIBRARY})
      target_include_directories(zoe_nccl INTERFACE ${ZOE_NCCL_INCLUDE})
    endif()
  elseif(ZOE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZOE_CUDA=ON but the CUDA toolkit was not found (set CUDAToolkit_ROOT)")
  endif()
endif()
# Device code (.cu: the GPU Adam, the GPT's CUDA kernels) is compiled by the toolkit's nvcc, for
# ZOE_CUDA_ARCHS only (default 90: H100/H200), so that a clean build stays quick on small CI hosts.
set(ZOE_CUDA_ARCHS "90" CACHE STRING "CUDA architectures to compile device code for (CMAKE_CUDA_ARCHITECTURES)")
if(ZOE_HAVE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    if(CUDAToolkit_NVCC_EXECUTABLE)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    else()
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_ROOT}/bin/nvcc)
    endif()
  endif()
  if(NOT CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
  endif()
  set(CMAKE_CUDA_ARCHITECTURES ${ZOE_CUDA_ARCHS})
  enable_language(CUDA)
  # Device code is C++20 like the rest. CMake < 3.26 does not know nvcc's C++20 flag (and would
  # take the CUDA standard from CXX_STANDARD and fail): teach it.
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  zoe_summary("CUDA" ZOE_HAVE_CUDA "${CUDAToolkit_VERSION} (device code for archs ${ZOE_CUDA_ARCHS})")
else()
  zoe_summary("CUDA" ZOE_HAVE_CUDA "")
endif()
zoe_summary("NCCL" ZOE_HAVE_NCCL "${ZOE_NCCL_LIBRARY}")

if(ZOE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(ZOE_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()

message(STATUS "zoe: optional dependencies")
foreach(_line IN LISTS _zoe_summary)
  message(STATUS "${_line}")
endforeach()

# One generated header carries the feature switches to the code.
configure_file(${CMAKE_CURRENT_LIST_DIR}/zoe_features.h.in ${CMAKE_BINARY_DIR}/generated/zoe/features.h @ONLY)
