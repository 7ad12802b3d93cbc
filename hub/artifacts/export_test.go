package artifacts

import "debug/elf"

// HoldsString is holdsString on the executable at path built for goarch.
func HoldsString(path, goarch, s string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	return holdsString(f, elfArches[goarch], s)
}
