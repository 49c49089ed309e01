// Left out of every generated kernel: translate/include/cutlass_trim/README.md.
#pragma once
