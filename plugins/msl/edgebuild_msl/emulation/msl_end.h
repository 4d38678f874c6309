// Ends a kernel's translation unit: the address-space words are plain names again.
#undef device
#undef constant
#undef thread
#undef threadgroup
