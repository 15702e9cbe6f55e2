// See README.md beside this directory: ProcessGroupGloo.hpp includes it, needs nothing from it.
#pragma once
