// libzoe.so has no code of its own: it is zoe's layer objects, all of them (cmake/ZoeInstall.cmake).
