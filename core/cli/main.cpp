#include <iostream>
#include "axengine/version.hpp"
int main() { std::cout << "axengine " << ax::kVersion << "\n"; }
