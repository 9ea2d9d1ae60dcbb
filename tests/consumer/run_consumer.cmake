# cmake -P script run by ctest: install the build into PREFIX, build the consumer project against it, run it.
foreach(var FLASHLITE_BUILD_DIR PREFIX CONSUMER_SOURCE CONSUMER_BUILD GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake needs -D${var}=...")
  endif()
endforeach()

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: ${step} failed (exit ${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE "${PREFIX}" "${CONSUMER_BUILD}")
run("cmake --install" ${CMAKE_COMMAND} --install "${FLASHLITE_BUILD_DIR}" --prefix "${PREFIX}")

file(GLOB_RECURSE config "${PREFIX}/*/flashliteConfig.cmake")
foreach(f "${PREFIX}/include/flashlite/attention.h" "${PREFIX}/include/flashlite/tensor.h" ${config})
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "consumer test: ${f} was not installed")
  endif()
endforeach()
if(NOT config)
  message(FATAL_ERROR "consumer test: no flashliteConfig.cmake under ${PREFIX}")
endif()

# Only the scratch prefix may provide flashlite: no package registry, no build tree.
set(configure_args -S "${CONSUMER_SOURCE}" -B "${CONSUMER_BUILD}" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DEXPECTED_PREFIX=${PREFIX}"
    "-DEXPECT_CUDA=${EXPECT_CUDA}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(BUILD_TYPE)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
if(CUDA_ROOT)
  list(APPEND configure_args "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
endif()
run("configure the consumer" ${CMAKE_COMMAND} ${configure_args})
run("build the consumer" ${CMAKE_COMMAND} --build "${CONSUMER_BUILD}")
run("run the consumer" "${CONSUMER_BUILD}/flashlite_consumer")
