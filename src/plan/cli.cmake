# Included by tools/CMakeLists.txt: the zoe commands built on zoe_plan.
target_sources(zoe PRIVATE ${PROJECT_SOURCE_DIR}/tools/cmd_plan.cpp ${PROJECT_SOURCE_DIR}/tools/cmd_tune.cpp)
target_link_libraries(zoe PRIVATE zoe_plan)
