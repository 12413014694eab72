"""Word lists for RULER's synthetic tasks (RULER draws them from the ``wonderwords`` package).

Keys of the niah tasks are ``adjective-noun`` pairs; common/uncommon words of cwe come from the
union of the lists, extended with generated pronounceable words when a long context needs more.
"""
from __future__ import annotations

import random

ADJECTIVES = tuple(sorted(set("""
able abrupt absent acid adorable agile airy alert alive amber ample ancient angry annual anxious aquatic
arctic aromatic ashamed astonishing athletic autumn awake awful bad bald bashful better bitter black bland
blue blushing bold bony bored bouncy brave breezy brief bright brisk broad broken bronze bumpy busy calm
capable careful cheap cheerful chilly chubby clean clever cloudy clumsy coarse cold colossal cool cosmic
crazy creamy crisp crooked crowded cruel curious curly damp dark dazzling deep defiant delicate delightful
dense devoted dim dizzy dry dull dusty eager early earthy easy eerie elated elderly electric elegant empty
enchanted endless energetic enormous envious even evil exact excited exotic faint fair faithful famous fancy
fast fat fearless feeble fierce filthy fine firm flat fluffy foggy fond fragile frail frank free fresh
friendly frosty frozen fuzzy gentle giant giddy gifted glad glamorous gleaming glorious golden gorgeous
graceful grand great greedy green grim grumpy guilty handsome happy hard harsh hasty healthy heavy helpful
hidden high hollow honest hot huge humble hungry icy idle ill immense important innocent itchy jagged jealous
jolly joyous juicy jumpy kind large late lazy light lively lonely long loose loud lovely loyal lucky lush
magic majestic mellow melodic merry mighty mild minty misty modern moist muddy mushy mute narrow nasty neat
nervous new nice nimble noisy noble normal numb odd old orange ordinary pale perfect petite plain playful
pleasant plump polite poor powerful precious pretty prickly proud purple quaint quick quiet rapid rare raspy
ready real red rich rigid ripe rough round royal rural rustic sad safe salty scary secret selfish shaggy
sharp shiny short shy silent silky silly simple sleepy slim slow small smooth soft solid sore sour spicy
splendid spotty square steady steep sticky stormy strange strict strong sturdy sunny super sweet swift tall
tame tart tender tense thick thin thirsty tidy tiny tired tough tricky true ugly uneven unique upbeat useful
vague vast velvet violet vivid warm wary weak wealthy weary wet whole wicked wide wild wise witty wooden
worried yellow young zany zealous
""".split())))

NOUNS = tuple(sorted(set("""
account acre actor advice airport alarm album anchor angle animal ankle answer apple apron arch area argument
army arrow artist attic aunt avenue baby backpack bag bakery balance balloon banana band bank barn basket bath
battery beach bean bear bed bee beetle bell belt bench berry bicycle bird blanket blossom boat body bone book
boot bottle boundary bowl box brain branch bread breakfast brick bridge brother brush bucket building bulb
butter button cabin cable cactus cake camera camp canal candle canvas captain car card carpet carriage castle
cat cattle cave ceiling cellar chair chalk channel cheese cherry chess chicken child chimney church circle
city clock cloud coast coat coffee coin collar comb comet compass cook copper corn cottage cotton country
cousin cow crayon cricket crow crown cup curtain cushion daisy dance desert desk diamond dinner doctor dog
doll dolphin door dragon drawer dream dress drum duck eagle ear earth egg elbow elephant engine eye face
fairy farm father feather fence field finger fire fish flag flame flower flute fog forest fork fountain fox
frog fruit garden gate ghost giraffe glass glove goat gold grape grass guitar hall hammer hand harbor hat
hawk heart helmet hill hobby honey horse hospital house island jacket jar jelly jewel judge jungle kettle
key king kitchen kite kitten knee knife ladder lake lamp lantern leaf lemon letter library lily lion lizard
lock machine magnet map marble market meadow melody mirror monkey moon morning mountain mouse mushroom
needle nest net night notebook ocean office orange orchard owl oyster paint palace pancake paper parcel
parrot path peach pearl pencil pepper piano pickle picture pig pillow pilot pine pipe planet plant plate
pocket poem pond potato powder puppy puzzle queen quilt rabbit radio rain rainbow river road robin rock
roof room rope rose sail salt sand saucer scarf school scissors sea seed shadow sheep shell ship shoe shop
silver singer sister sky snail snake snow soap sock sofa song spider spoon spring square squirrel stair
star station stone storm stove straw stream street sugar summer sun swan sweater table tail teacher temple
tent thunder ticket tiger toast tomato tooth tower town toy train tree trumpet tulip tunnel turtle umbrella
uncle valley vase village violin wagon wall wallet water wave whale wheel whistle window wing winter wolf
wood wool worm yard yacht zebra
""".split())))

VERBS = tuple(sorted(set("""
accept add admire agree allow answer appear arrive ask attack bake balance bang bathe beg behave belong bless
boast boil borrow bounce breathe bump burn buzz calculate call camp care carry carve cause challenge change
charge chase cheat check cheer chew choke chop claim clap clean clear climb close coach collect comb command
complain confess connect consider copy correct cough count cover crack crash crawl cross crush cry cure curl
cycle damage dance dare decide deliver depend describe design destroy develop dig dream dress drift drink
drop dry earn educate embrace employ empty encourage end enjoy enter escape examine excite excuse exist
expand explain explode fade fail fasten fax fear fetch file fill film fire fit fix flap flash float flood
flow fold follow fool force form found frame fry gather gaze glow glue grab grate greet grin grip groan guard
guess guide hammer hand handle hang happen harm hate haunt heal heat help hop hover hug hum hunt hurry
identify ignore imagine impress improve include increase inform inject insert inspect instruct invent
invite itch jam jog join joke judge juggle jump kick kiss kneel knit knock knot label land last laugh launch
learn level lick lift like listen load lock long look love manage march mark marry match melt memorize
mend milk mine miss mix moan move mourn mug multiply nail nest nod note notice number obey observe obtain
occur offend offer open order own pack paddle paint park part pass paste pat pause peck pedal peel perform
permit phone pick pinch plan plant play please plug point poke polish pop possess post pour practice pray
preach precede prefer prepare present preserve press pretend prevent print produce program promise protect
provide pull pump punch puncture punish push question queue race radiate rain raise reach realize receive
""".split())))


def base_words() -> list[str]:
    """Nouns, adjectives and verbs, sorted and unique."""
    return sorted(set(NOUNS) | set(ADJECTIVES) | set(VERBS))


_CONS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def pronounceable_words(n: int, seed: int, exclude: set[str]) -> list[str]:
    """``n`` distinct generated words of 3 consonant-vowel syllables, deterministic by ``seed``."""
    rng = random.Random(f"pronounceable-{seed}")
    out: list[str] = []
    seen = set(exclude)
    while len(out) < n:
        w = "".join(rng.choice(_CONS) + rng.choice(_VOWELS) for _ in range(3))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out
