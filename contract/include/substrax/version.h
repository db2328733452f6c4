// The version of the substrax SDK these headers belong to (semantic versioning: a program built
// against one major version runs only with a library and worker of that major version;
// substrax::Init checks both and refuses another with a message saying what to rebuild).
#ifndef SUBSTRAX_VERSION_H_
#define SUBSTRAX_VERSION_H_

#define SUBSTRAX_VERSION_MAJOR 1
#define SUBSTRAX_VERSION_MINOR 0
#define SUBSTRAX_VERSION_PATCH 0
#define SUBSTRAX_VERSION_STRING "1.0.0"

#endif  // SUBSTRAX_VERSION_H_
