# Decides MIXPREC_MPI: the data-parallel layer (src/dist/, include/mixprec/dist.h) is built only where
# an MPI library is found (Debian: libopenmpi-dev); OFF otherwise, with one line saying why, and the
# library, the CLI and the suite build exactly as before.
#   -DMIXPREC_MPI=AUTO|ON|OFF   AUTO (default): as found; ON: fail configuring if not found
set(MIXPREC_MPI AUTO CACHE STRING "Build data parallelism over MPI: AUTO, ON or OFF")
set_property(CACHE MIXPREC_MPI PROPERTY STRINGS AUTO ON OFF)

set(MIXPREC_MPI_ENABLED OFF)
if(MIXPREC_MPI STREQUAL "OFF")
  message(STATUS "mixprec: MPI (data parallelism) OFF: MIXPREC_MPI=OFF")
  return()
endif()
# The C API from C++ (the project enables no C compiler): MPI_CXX_SKIP_MPICXX leaves out the C++
# bindings, deprecated since MPI 2.2 and gone from MPI 3.
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI COMPONENTS CXX QUIET)
if(NOT MPI_CXX_FOUND OR NOT MPIEXEC_EXECUTABLE)
  if(MIXPREC_MPI STREQUAL "ON")
    message(FATAL_ERROR "MIXPREC_MPI=ON but no MPI library with an mpiexec was found (Debian: libopenmpi-dev openmpi-bin)")
  endif()
  message(STATUS "mixprec: MPI (data parallelism) OFF: no MPI library with an mpiexec found "
                 "(Debian: libopenmpi-dev openmpi-bin)")
  return()
endif()

# Open MPI's mpiexec refuses root and more ranks than free cores unless told (a CI root, a shared
# 2-core machine); its -x passes a variable to every rank. Other MPIs: no flags.
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _mpiexec_version ERROR_QUIET)
set(MIXPREC_MPIEXEC_FLAGS "")
if(_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(MIXPREC_MPIEXEC_FLAGS --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS)
endif()
set(MIXPREC_MPI_ENABLED ON)
message(STATUS "mixprec: MPI (data parallelism) ON: MPI ${MPI_CXX_VERSION}, ${MPIEXEC_EXECUTABLE} ${MIXPREC_MPIEXEC_FLAGS}")
