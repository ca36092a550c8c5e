"""Named ASCII byte values for kernels that read text byte by byte.

Module-level ints: numba freezes a global it reads into the machine code as a constant, so a
kernel comparing a byte with `QUOTE` compiles to the same instruction as one comparing it with
34. Only the bytes some kernel reads are named.
"""

TAB = ord("\t")
NEWLINE = ord("\n")
CARRIAGE_RETURN = ord("\r")
SPACE = ord(" ")  # also the first printable byte: every byte below it is a control character
QUOTE = ord('"')
PLUS = ord("+")
COMMA = ord(",")
MINUS = ord("-")
DOT = ord(".")
SLASH = ord("/")
DIGIT_0 = ord("0")
DIGIT_1 = ord("1")
DIGIT_9 = ord("9")
COLON = ord(":")
UPPER_A = ord("A")
UPPER_E = ord("E")
UPPER_F = ord("F")
LEFT_BRACKET = ord("[")
BACKSLASH = ord("\\")
RIGHT_BRACKET = ord("]")
LOWER_A = ord("a")
LOWER_B = ord("b")
LOWER_E = ord("e")
LOWER_F = ord("f")
LOWER_N = ord("n")
LOWER_R = ord("r")
LOWER_T = ord("t")
LOWER_U = ord("u")
LEFT_BRACE = ord("{")
RIGHT_BRACE = ord("}")

CASE_BIT = 0x20  # set in a lower-case letter, clear in its upper case: `c | CASE_BIT` lowers
NON_ASCII = 0x80  # the first byte past ASCII
