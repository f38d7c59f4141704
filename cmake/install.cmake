# `cmake --install BUILD [--prefix DIR]`: the public headers, libmixprec (static, or shared with
# -DBUILD_SHARED_LIBS=ON), the mixprec CLI, a CMake package (find_package(mixprec): the
# mixprec::mixprec target) and a pkg-config file (mixprec.pc). Both are relocatable: they find the
# prefix from their own place, so a tree installed with --prefix works wherever it is.
# Tests, benchmarks and src/'s internal headers are not installed. docs/install.md, "Using the library".
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MIXPREC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mixprec)
# The soname changes with each release that may break the ABI: the minor version while it is 0.x.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_mixprec_soversion ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(_mixprec_soversion ${PROJECT_VERSION_MAJOR})
endif()
set_target_properties(mixprec PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${_mixprec_soversion}
                                         EXPORT_NAME mixprec)
# The installed CLI finds a shared libmixprec beside it (lib/), wherever the prefix is, and keeps
# the directories of libraries outside the system's (the CUDA toolkit's) that it was linked with.
file(RELATIVE_PATH _mixprec_bin_to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
# scripts/gpu/pack.sh sets MIXPREC_RELOCATABLE_RPATH ($ORIGIN/lib): that and nothing else, for a
# bundle that carries its libraries to a machine laid out otherwise.
if(DEFINED MIXPREC_RELOCATABLE_RPATH)
  set_target_properties(mixprec_cli PROPERTIES INSTALL_RPATH "${MIXPREC_RELOCATABLE_RPATH}" INSTALL_RPATH_USE_LINK_PATH OFF)
else()
  set_target_properties(mixprec_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${_mixprec_bin_to_lib}" INSTALL_RPATH_USE_LINK_PATH ON)
endif()
set_target_properties(mixprec PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)  # a shared libmixprec: the same

install(TARGETS mixprec EXPORT mixprecTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mixprec DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(TARGETS mixprec_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT mixprecTargets NAMESPACE mixprec:: DESTINATION ${MIXPREC_CMAKE_DIR})

# What a consumer must find again: a static libmixprec carries its private dependencies' link lines
# (oneDNN, zlib, and with the CUDA backend the runtime, cuBLASLt and cuDNN), a shared one only its
# public ones (OpenMP, threads). nlohmann-json is header-only and used by src/ alone: never needed.
get_target_property(_mixprec_type mixprec TYPE)
if(_mixprec_type STREQUAL "STATIC_LIBRARY")
  set(MIXPREC_STATIC ON)
else()
  set(MIXPREC_STATIC OFF)
endif()
if(MIXPREC_CUDA_ENABLED)
  get_filename_component(MIXPREC_CUDA_ROOT ${CUDAToolkit_BIN_DIR} DIRECTORY)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mixprecConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/mixprecConfig.cmake INSTALL_DESTINATION ${MIXPREC_CMAKE_DIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mixprecConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mixprecConfig.cmake ${PROJECT_BINARY_DIR}/mixprecConfigVersion.cmake
        DESTINATION ${MIXPREC_CMAKE_DIR})

# mixprec.pc. `pkg-config --libs mixprec` must link a static libmixprec by itself (without
# --static), so there its dependencies go in Libs; for a shared one in Libs.private. OpenMP is
# public (the library runs on the caller's OpenMP pool), as in the CMake target.
file(RELATIVE_PATH _mixprec_pc_to_prefix ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" _mixprec_pc_to_prefix "${_mixprec_pc_to_prefix}")
# -L<dir> -l<name> rather than the file found (libdnnl.so.2.6): a minor update renames the file.
set(MIXPREC_PC_PRIVATE_LIBS "-L$<TARGET_LINKER_FILE_DIR:DNNL::dnnl> -ldnnl -lz")
if(MIXPREC_CUDA_ENABLED)
  get_filename_component(_mixprec_cudnn_dir ${MIXPREC_CUDNN_LIB} DIRECTORY)
  string(APPEND MIXPREC_PC_PRIVATE_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -lcublasLt")
  if(NOT _mixprec_cudnn_dir STREQUAL CUDAToolkit_LIBRARY_DIR)
    string(APPEND MIXPREC_PC_PRIVATE_LIBS " -L${_mixprec_cudnn_dir}")
  endif()
  string(APPEND MIXPREC_PC_PRIVATE_LIBS " -lcudnn")
  # The CUDA toolkit's libraries are shared and, unlike the system's, not on the loader's path
  # unless the toolkit's installer registered them (ld.so.conf.d): a program linked with a static
  # libmixprec records where they are, as CMake does for a find_package consumer. (A shared
  # libmixprec records them itself: INSTALL_RPATH_USE_LINK_PATH above.)
  set(_mixprec_cuda_rpath ${CUDAToolkit_LIBRARY_DIR} ${_mixprec_cudnn_dir})
  list(REMOVE_DUPLICATES _mixprec_cuda_rpath)
  list(JOIN _mixprec_cuda_rpath ":" _mixprec_cuda_rpath)
  string(APPEND MIXPREC_PC_PRIVATE_LIBS " -Wl,-rpath,${_mixprec_cuda_rpath}")
endif()
if(MIXPREC_MPI_ENABLED)  # src/dist/: MPI through its C API (MPI_CXX_SKIP_MPICXX)
  foreach(_mixprec_mpi_lib ${MPI_CXX_LIBRARIES})
    string(APPEND MIXPREC_PC_PRIVATE_LIBS " ${_mixprec_mpi_lib}")
  endforeach()
endif()
if(MIXPREC_STATIC)
  set(MIXPREC_PC_LIBS "-lmixprec ${MIXPREC_PC_PRIVATE_LIBS}")
  set(MIXPREC_PC_LIBS_PRIVATE "")
else()
  set(MIXPREC_PC_LIBS "-lmixprec")
  set(MIXPREC_PC_LIBS_PRIVATE "${MIXPREC_PC_PRIVATE_LIBS}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/mixprec.pc.in ${PROJECT_BINARY_DIR}/mixprec.pc.gen @ONLY)
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/mixprec.pc INPUT ${PROJECT_BINARY_DIR}/mixprec.pc.gen)
install(FILES ${PROJECT_BINARY_DIR}/mixprec.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
