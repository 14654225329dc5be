/* Kernel images: which architecture's code a real driver would run for a kernel (images.c,
 * Note [Kernel images and the card's compute capability]). Thread-safe. */
#ifndef FAKEGPU_IMAGES_H
#define FAKEGPU_IMAGES_H

/* Reads the architectures of a fat binary (__cudaRegisterFatBinary's argument); returns the handle
 * the caller passes back for its kernels. Never freed: a binary lives as long as its library. */
void **fg_images_register(void *fatbin);

/* Maps a kernel's host stub to its binary's architectures (__cudaRegisterFunction). */
void fg_images_add_kernel(void **handle, const void *host_fun);

/* The version (86 for sm_86) of the image a card of compute capability major.minor runs for the
 * kernel: the highest SASS of that major and a minor at most the card's, else the highest PTX at most
 * the card's capability, else the card's own (a kernel whose binary could not be read). */
int fg_image_version(const void *host_fun, int cc_major, int cc_minor);

#endif
